//! The review pages in a real browser: Debian's headless Chromium, driven through the
//! DevTools protocol over `--remote-debugging-pipe` (NUL-separated JSON on fds 3 and 4, so no
//! WebSocket client is needed). Sign in with a reviewer key, the list, a task's review,
//! Approve, Promote onto a target database, all by keyboard, on a laptop-sized window;
//! screenshots of each step go to `<target>/tmp/review_page/`.

mod common;
#[allow(dead_code)]
#[path = "support/shared_pg.rs"]
mod shared_pg;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine;
use common::{connect, Gateway};
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const REVIEWER_KEY: &str = "reviewer-key-for-alice-0123456789abcdef";
const WAIT: Duration = Duration::from_secs(90);

/// One browser page, driven over the DevTools pipe.
struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    from: mpsc::Receiver<Value>,
    events: VecDeque<Value>,
    next: u64,
    session: String,
    _profile: tempfile::TempDir,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors on success.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2");
    // SAFETY: both descriptors were just created and are owned here.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    fn start() -> Browser {
        use std::os::fd::AsRawFd;
        let profile = common::tempdir();
        let (cmd_read, cmd_write) = pipe();
        let (out_read, out_write) = pipe();
        let (cr, ow) = (cmd_read.as_raw_fd(), out_write.as_raw_fd());
        let mut cmd = std::process::Command::new(CHROMIUM);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-pipe",
            "--window-size=1366,900",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(cr, 3) < 0 || libc::dup2(ow, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start chromium");
        drop(cmd_read);
        drop(out_write);
        let (tx, rx) = mpsc::channel();
        let mut reader = std::fs::File::from(out_read);
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 65536];
            loop {
                let n = match reader.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                while let Some(i) = buf.iter().position(|&b| b == 0) {
                    let msg: Vec<u8> = buf.drain(..=i).collect();
                    if let Ok(v) = serde_json::from_slice::<Value>(&msg[..msg.len() - 1]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to: std::fs::File::from(cmd_write),
            from: rx,
            events: VecDeque::new(),
            next: 0,
            session: String::new(),
            _profile: profile,
        };
        let t = b.call("Target.createTarget", json!({"url": "about:blank"}));
        let target = t["targetId"].as_str().expect("target id").to_string();
        let s = b.call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        b.session = s["sessionId"].as_str().expect("session").to_string();
        b.call("Page.enable", json!({}));
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1366, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        );
        b
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).expect("json");
        bytes.push(0);
        self.to.write_all(&bytes).expect("write to chromium");
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {method}"));
            if v["id"].as_u64() == Some(id) {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
            self.events.push_back(v);
        }
    }

    fn wait_event(&mut self, name: &str) {
        if let Some(i) = self.events.iter().position(|e| e["method"] == name) {
            self.events.drain(..=i);
            return;
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {name} event"));
            if v["method"] == name {
                return;
            }
        }
    }

    fn goto(&mut self, url: &str) {
        self.events.clear();
        self.call("Page.navigate", json!({"url": url}));
        self.wait_event("Page.loadEventFired");
    }

    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    fn text(&mut self) -> String {
        self.eval("document.body.innerText")
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn focus(&mut self, selector: &str) {
        let ok = self.eval(&format!(
            "(() => {{ const e = document.querySelector({}); if (!e) return false; e.focus(); return document.activeElement === e; }})()",
            json!(selector)
        ));
        assert_eq!(ok, json!(true), "cannot focus {selector}");
    }

    fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({"text": text}));
    }

    fn key(&mut self, key: &str, code: &str, vk: u32, text: &str) {
        for t in ["keyDown", "keyUp"] {
            let mut p = json!({"type": t, "key": key, "code": code, "windowsVirtualKeyCode": vk});
            if t == "keyDown" && !text.is_empty() {
                p["text"] = json!(text);
            }
            self.call("Input.dispatchKeyEvent", p);
        }
    }

    /// Enter on the focused element, and wait for the page it leads to.
    fn enter_and_wait(&mut self) {
        self.events.clear();
        self.key("Enter", "Enter", 13, "\r");
        self.wait_event("Page.loadEventFired");
    }

    fn screenshot(&mut self, dir: &Path, name: &str) -> PathBuf {
        let r = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap_or(""))
            .expect("png base64");
        assert!(png.starts_with(b"\x89PNG"), "{name} is not a PNG");
        let p = dir.join(name);
        std::fs::write(&p, png).expect("write screenshot");
        p
    }

    /// Nothing on the page is wider than the window: wide tables scroll in their own box.
    fn fits_window(&mut self) -> bool {
        self.eval("document.documentElement.scrollWidth <= window.innerWidth") == json!(true)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn list_review_approve_promote_in_headless_chromium() {
    if !common::require(
        Path::new(CHROMIUM).exists(),
        CHROMIUM,
        "Debian package chromium",
    ) {
        return;
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("review_page");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("output dir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        // The target: a database holding what the golden holds, written as a role of its own.
        let pg = shared_pg::SharedPg::start().await;
        let admin = pg.admin("postgres").await;
        for sql in ["CREATE DATABASE items_target", "CREATE ROLE app_writer NOLOGIN"] {
            admin.batch_execute(sql).await.expect("target db");
        }
        let t = pg.admin("items_target").await;
        t.batch_execute(&format!(
            "{}\nGRANT SELECT, INSERT, UPDATE, DELETE ON items TO app_writer;",
            common::SMALL_GOLDEN
        ))
        .await
        .expect("target data");
        let config = format!(
            "[pool]\nsize = 0\n\n[promote]\nreviewers_may_promote = true\n\
             [promote.reviewer_keys]\nalice = \"{REVIEWER_KEY}\"\n\
             [promote.targets.default]\ndsn = \"host={} port={} user={} dbname=items_target\"\nrole = \"app_writer\"\n",
            pg.socket_dir.display(),
            pg.port,
            shared_pg::ADMIN
        );
        let g = Gateway::start(Some(common::SMALL_GOLDEN), Some(&config));
        let tok = g.issue("rename-first-item", 600);
        let id = tok["id"].as_str().expect("id").to_string();
        let c = connect(tok["dsn"].as_str().unwrap()).await.expect("connect");
        c.batch_execute(
            "UPDATE items SET name = 'renamed by the agent' WHERE id = 1; \
             INSERT INTO items VALUES (1001, 'added by the agent')",
        )
        .await
        .expect("task");
        drop(c);
        assert_eq!(g.revoke(&id).0, 200);

        let mut b = Browser::start();
        // Sign in: the key field has focus; type and press Enter.
        b.goto(&format!("{}/review", g.api));
        assert!(b.text().contains("Admin or reviewer key"), "{}", b.text());
        b.screenshot(&out, "1-sign-in.png");
        b.focus("#key");
        b.type_text("not the key, but long enough to be one");
        b.enter_and_wait();
        assert!(b.text().contains("neither the admin key nor a reviewer key"), "{}", b.text());
        b.focus("#key");
        b.type_text(REVIEWER_KEY);
        b.enter_and_wait();

        // The list.
        let list = b.text();
        assert!(list.contains("Tasks to review") && list.contains("signed in as reviewer:alice"), "{list}");
        assert!(list.contains(&id) && list.contains("needs review"), "{list}");
        assert!(b.fits_window());
        b.screenshot(&out, "2-list.png");

        // The task's review, reached from the list by keyboard.
        b.focus(&format!("a[href='/review/{id}']"));
        b.enter_and_wait();
        let page = b.text();
        assert!(page.contains("What the task changed") && page.contains("renamed by the agent"), "{page}");
        assert!(page.contains("UPDATE items SET name"), "statement log missing: {page}");
        assert!(b.fits_window(), "the page is wider than the window");
        b.screenshot(&out, "3-review.png");

        // Approve with a comment.
        b.focus("#comment");
        b.type_text("Renaming item 1 was asked for.");
        b.focus("#approve");
        b.enter_and_wait();
        let page = b.text();
        assert!(page.contains("Recorded: approved."), "{page}");
        assert!(page.contains("reviewer:alice") && page.contains("Renaming item 1 was asked for."), "{page}");
        assert!(page.contains("Default target: postgresql://") && page.contains("items_target"), "{page}");
        b.screenshot(&out, "4-approved.png");

        // Promote to the named target.
        b.focus("#promote");
        b.enter_and_wait();
        let page = b.text();
        assert!(page.contains("Promoted to postgresql://"), "{page}");
        assert!(page.contains("promoted"), "{page}");
        b.screenshot(&out, "5-promoted.png");

        // The change is in the target, and only it.
        let rows = t
            .query("SELECT id, name FROM items WHERE id IN (1, 2, 1001) ORDER BY id", &[])
            .await
            .expect("target rows");
        let got: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(
            got,
            vec![
                (1, "renamed by the agent".to_string()),
                (2, "item 2".to_string()),
                (1001, "added by the agent".to_string())
            ]
        );
        // A form posted without the session's CSRF token is refused.
        let url = format!("{}/review/{id}/decide", g.api);
        let form = common::Body::Form(&[("decision", "approve"), ("comment", "x")]);
        match common::http("POST", &url, None, form) {
            Ok(r) if r.status == 403 => {}
            Ok(r) => panic!("{} {}", r.status, r.body),
            Err(e) => panic!("{e}"),
        }
        // Decisions and promotions outlive the gateway; sign-ins do not.
        drop(b);
        let mut g = g;
        g.stop();
        let g2 = Gateway::start_in(&g.data_dir, Some(common::SMALL_GOLDEN), Some(&config));
        let (s, r) = g2.raw_call("GET", &format!("/v1/tokens/{id}/review"), None);
        assert_eq!(s, 200, "{r}");
        assert_eq!(r["state"], "promoted", "{r}");
        assert_eq!(r["trail"][0]["by"], "reviewer:alice", "{r}");
        assert_eq!(r["trail"][0]["comment"], "Renaming item 1 was asked for.", "{r}");
        assert_eq!(r["promotions"][0]["role"], "app_writer", "{r}");
        eprintln!("screenshots in {}", out.display());
    });
}

//! The review pages in a real browser: Debian's headless Chromium, driven through the
//! DevTools protocol over `--remote-debugging-pipe` (NUL-separated JSON on fds 3 and 4, so no
//! WebSocket client is needed). Sign in with a reviewer key, the list and its filters, a
//! task's page (why, promotability, a dry run, the change paged, the log filtered), Approve,
//! Promote onto a target database, a hostile task whose approval is blocked, all by
//! keyboard, on a laptop-sized window;
//! screenshots of each step go to `<target>/tmp/review_page/`.

use crate::support::harness;
use crate::support::shared_pg;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::harness::{connect, Gateway};
use base64::Engine;
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
        let profile = harness::tempdir();
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
                // Moved above 4 first: a pipe end that already is fd 3 or 4 would be
                // clobbered by the other dup2, or keep its close-on-exec flag (dup2 onto
                // itself changes nothing) and vanish at exec.
                let (c, o) = (
                    libc::fcntl(cr, libc::F_DUPFD, 10),
                    libc::fcntl(ow, libc::F_DUPFD, 10),
                );
                if c < 0 || o < 0 || libc::dup2(c, 3) < 0 || libc::dup2(o, 4) < 0 {
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

    /// The window's view with `selector` scrolled to its top, for looking at one part.
    fn screenshot_at(&mut self, dir: &Path, name: &str, selector: &str) -> PathBuf {
        self.eval(&format!(
            "(() => {{ const e = document.querySelector({}); if (e) e.scrollIntoView(); return !!e; }})()",
            json!(selector)
        ));
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap_or(""))
            .expect("png base64");
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
    if !harness::require(
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
            harness::SMALL_GOLDEN
        ))
        .await
        .expect("target data");
        let config = format!(
            "[pool]\nsize = 0\n\n[promote]\nreviewers_may_promote = true\n\
             [promote.reviewer_keys]\nalice = \"{REVIEWER_KEY}\"\n\
             [promote.targets.default]\ndsn = \"host={} port={} user={} dbname=items_target\"\nrole = \"app_writer\"\n\
             [[promote.validators]]\nname = \"no empty names\"\nsql = \"SELECT id FROM public.items WHERE name = ''\"\n",
            pg.socket_dir.display(),
            pg.port,
            shared_pg::ADMIN
        );
        let g = Gateway::start(Some(harness::SMALL_GOLDEN), Some(&config));
        // The task under review: a rename, 59 touched names (two pages of rows), an insert
        // and a read; issued with metadata saying why (hostile text included).
        let tok = g.issue_with(json!({"task": "rename-first-item", "ttl_seconds": 600,
            "metadata": {"why": "Ticket OPS-42: rename item 1 <script>window.__xss = 1</script>", "requested_by": "dana"}}));
        let id = tok["id"].as_str().expect("id").to_string();
        let c = connect(tok["dsn"].as_str().unwrap()).await.expect("connect");
        c.batch_execute(
            "SELECT count(*) FROM items; \
             UPDATE items SET name = 'renamed by the agent' WHERE id = 1; \
             UPDATE items SET name = name || ' (checked)' WHERE id BETWEEN 2 AND 60; \
             INSERT INTO items VALUES (1001, 'added by the agent')",
        )
        .await
        .expect("task");
        drop(c);
        assert_eq!(g.revoke(&id).0, 200);
        // A second task: row security the review does not model ("patch verified: differs"),
        // a value written to run script in the reviewer's browser, and an empty name that
        // fails the validator.
        let bad = g.issue("hostile-task", 600);
        let bad_id = bad["id"].as_str().expect("id").to_string();
        let c = connect(bad["dsn"].as_str().unwrap()).await.expect("connect");
        c.batch_execute(
            "ALTER TABLE items ENABLE ROW LEVEL SECURITY; \
             UPDATE items SET name = '<img src=x onerror=\"window.__xss = 2\">' WHERE id = 3; \
             UPDATE items SET name = '' WHERE id = 4",
        )
        .await
        .expect("hostile task");
        drop(c);
        assert_eq!(g.revoke(&bad_id).0, 200);

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

        // The list, and its filters.
        let list = b.text();
        assert!(list.contains("Tasks to review") && list.contains("signed in as reviewer:alice"), "{list}");
        assert!(list.contains(&id) && list.contains(&bad_id) && list.contains("needs review"), "{list}");
        assert!(list.contains("promotable (1)") && list.contains("failed (1)") && list.contains("needs review (2)"), "{list}");
        assert!(b.fits_window());
        b.screenshot(&out, "2-list.png");
        for (filter, with, without) in [("promotable", &id, &bad_id), ("failed", &bad_id, &id)] {
            b.focus(&format!("#filter-{filter}"));
            b.enter_and_wait();
            let t = b.text();
            assert!(t.contains(with.as_str()) && !t.contains(without.as_str()), "{filter}: {t}");
        }
        b.screenshot(&out, "2b-list-failed.png");

        // The task's review, reached from the list by keyboard.
        b.focus("a[href='/review']");
        b.enter_and_wait();
        b.focus(&format!("a[href='/review/{id}']"));
        b.enter_and_wait();
        let page = b.text();
        assert!(page.contains("What the task changed") && page.contains("renamed by the agent"), "{page}");
        // Why first, then whether it can be promoted, the change, and only then the buttons.
        let order = b.eval(
            "(() => { const ids = ['why', 'promotability', 'review', 'decision', 'statements']; \
             const e = ids.map(i => document.getElementById(i)); if (e.some(x => !x)) return 'missing'; \
             for (let i = 1; i < e.length; i++) if (!(e[i-1].compareDocumentPosition(e[i]) & 4)) return ids[i-1] + ' after ' + ids[i]; \
             return document.getElementById('review').compareDocumentPosition(document.getElementById('approve')) & 4 ? 'ok' : 'approve above the diff'; })()",
        );
        assert_eq!(order, json!("ok"));
        assert!(page.contains("Ticket OPS-42: rename item 1 <script>window.__xss = 1</script>") && page.contains("dana"), "{page}");
        assert!(page.contains("Yes: nothing found blocks promotion"), "{page}");
        assert!(page.contains("1 inserted, 60 updated, 0 deleted rows"), "plan: {page}");
        assert_eq!(b.eval("document.getElementById('verdict').textContent"), json!("patch verified: exact"));
        assert_eq!(b.eval("document.getElementById('approve').disabled"), json!(false));
        // Changed cells are highlighted; unchanged ones are not.
        let chg = b.eval("(() => { const c = document.querySelectorAll('#rows td.chg'); return [c.length, c.length ? getComputedStyle(c[0]).backgroundColor : '']; })()");
        assert_eq!(chg, json!([98, "rgb(255, 211, 61)"]), "49 updated rows on the first page, before and after");
        // Every changed row, 50 to a page: the second page holds the rest.
        assert!(page.contains("rows 1–50 of 61"), "{page}");
        // The log shows writes by default: the read is behind "show all".
        assert!(page.contains("UPDATE items SET name") && !page.contains("SELECT count(*) FROM items"), "{page}");
        assert!(b.fits_window(), "the page is wider than the window");
        b.screenshot(&out, "3-review.png");
        b.screenshot_at(&out, "3-top.png", "h1");
        b.screenshot_at(&out, "3-rows.png", "#rows");
        b.screenshot_at(&out, "3-decision.png", "#validators");
        b.screenshot_at(&out, "3-log.png", "#statements");
        b.focus("#t0 a.next");
        b.enter_and_wait();
        let page = b.text();
        b.screenshot_at(&out, "3b-rows-page-2.png", "#t0");
        assert!(page.contains("rows 51–61 of 61") && page.contains("item 60 (checked)"), "{page}");
        b.focus("#log-all");
        b.enter_and_wait();
        let page = b.text();
        assert!(page.contains("SELECT count(*) FROM items") && page.contains("show only writes"), "{page}");
        b.screenshot(&out, "3b-rows-page-2-all-statements.png");

        // A dry run before deciding: it would apply, and nothing is committed.
        b.focus("#dry-run");
        b.enter_and_wait();
        let page = b.text();
        assert!(page.contains("the change would apply; nothing was committed"), "{page}");
        assert!(page.contains("Last dry run: would apply"), "{page}");
        let name: String = t.query_one("SELECT name FROM items WHERE id = 1", &[]).await.expect("row").get(0);
        assert_eq!(name, "item 1", "the dry run committed");

        // Approve with a comment: the buttons are gone, and the decision is final.
        b.focus("#comment");
        b.type_text("Renaming item 1 was asked for.");
        b.focus("#approve");
        b.enter_and_wait();
        let page = b.text();
        assert!(page.contains("Recorded: approved."), "{page}");
        assert!(page.contains("reviewer:alice") && page.contains("Renaming item 1 was asked for."), "{page}");
        assert!(page.contains("Decisions are final"), "{page}");
        assert_eq!(b.eval("!document.getElementById('approve') && !document.getElementById('reject')"), json!(true));
        assert!(page.contains("Default target: postgresql://") && page.contains("items_target"), "{page}");
        b.screenshot(&out, "4-approved.png");
        b.screenshot_at(&out, "4-decided.png", "#decision");
        for verb in ["approve", "reject"] {
            let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{id}/{verb}"), Some(json!({"comment": "again"})));
            assert_eq!(s, 409, "{v}");
            assert!(v["error"].as_str().unwrap_or("").contains("decisions are final"), "{v}");
        }

        // Promote to the named target.
        b.focus("#promote");
        b.enter_and_wait();
        let page = b.text();
        assert!(page.contains("Promoted to postgresql://"), "{page}");
        assert!(page.contains("promoted") && page.contains("Promoted already"), "{page}");
        b.screenshot(&out, "5-promoted.png");

        // The change is in the target, and only it.
        let rows = t
            .query("SELECT id, name FROM items WHERE id IN (1, 2, 61, 1001) ORDER BY id", &[])
            .await
            .expect("target rows");
        let got: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(
            got,
            vec![
                (1, "renamed by the agent".to_string()),
                (2, "item 2 (checked)".to_string()),
                (61, "item 61".to_string()),
                (1001, "added by the agent".to_string())
            ]
        );

        // The hostile task: approval is blocked, with the patch check's verdict beside the
        // disabled button; its script never runs.
        b.goto(&format!("{}/review/{bad_id}", g.api));
        let page = b.text();
        assert!(page.contains("No: approval is blocked"), "{page}");
        assert_eq!(b.eval("document.getElementById('approve').disabled"), json!(true));
        let verdict = b.eval("document.getElementById('verdict').textContent");
        assert!(verdict.as_str().unwrap_or("").starts_with("patch verified: differs"), "{verdict}");
        let blockers = b.eval("document.getElementById('blockers').textContent");
        let blockers = blockers.as_str().unwrap_or("");
        assert!(blockers.contains("does not model") && blockers.contains("validator no empty names failed"), "{blockers}");
        assert!(page.contains("<img src=x onerror=\"window.__xss = 2\">"), "the value is shown as text: {page}");
        assert_eq!(b.eval("[typeof window.__xss, document.querySelectorAll('main img, main script').length]"), json!(["undefined", 0]));
        b.screenshot(&out, "6-blocked.png");
        b.screenshot_at(&out, "6-top.png", "h1");
        b.screenshot_at(&out, "6-decision.png", "#validators");
        assert!(b.fits_window(), "the blocked page is wider than the window");
        let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{bad_id}/approve"), Some(json!({"comment": "looks fine"})));
        assert_eq!(s, 409, "{v}");
        assert!(v["error"].as_str().unwrap_or("").contains("does not model"), "{v}");

        // A form posted without the session's CSRF token is refused.
        let url = format!("{}/review/{id}/decide", g.api);
        let form = harness::Body::Form(&[("decision", "approve"), ("comment", "x")]);
        match harness::http("POST", &url, None, form) {
            Ok(r) if r.status == 403 => {}
            Ok(r) => panic!("{} {}", r.status, r.body),
            Err(e) => panic!("{e}"),
        }
        // Decisions and promotions outlive the gateway; sign-ins do not.
        drop(b);
        let mut g = g;
        g.stop();
        let g2 = Gateway::start_in(&g.data_dir, Some(harness::SMALL_GOLDEN), Some(&config));
        let (s, r) = g2.raw_call("GET", &format!("/v1/tokens/{id}/review"), None);
        assert_eq!(s, 200, "{r}");
        assert_eq!(r["state"], "promoted", "{r}");
        let approved = r["trail"].as_array().and_then(|t| t.iter().find(|e| e["action"] == "approved")).cloned().unwrap_or_default();
        assert_eq!(approved["by"], "reviewer:alice", "{r}");
        assert_eq!(approved["comment"], "Renaming item 1 was asked for.", "{r}");
        assert_eq!(r["promotions"][0]["dry_run"], true, "{r}");
        assert_eq!(r["promotions"][1]["role"], "app_writer", "{r}");
        eprintln!("screenshots in {}", out.display());
    });
}

/// Approval is refused over the API while the stored review's patch check says "differs",
/// even with no change captured (so no promotability verdict); a rejection stands, and is
/// final.
#[test]
fn approval_refused_while_the_review_does_not_model_the_change() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let g = Gateway::start(
            Some(harness::SMALL_GOLDEN),
            Some("[pool]\nsize = 0\n\n[promote]\ncapture = false\n"),
        );
        let tok = g.issue("row-security", 600);
        let id = tok["id"].as_str().expect("id").to_string();
        let c = connect(tok["dsn"].as_str().unwrap())
            .await
            .expect("connect");
        c.batch_execute("ALTER TABLE items ENABLE ROW LEVEL SECURITY")
            .await
            .expect("task");
        drop(c);
        assert_eq!(g.revoke(&id).0, 200);
        let (s, r) = g.raw_call("GET", &format!("/v1/tokens/{id}/review"), None);
        assert_eq!(s, 200, "{r}");
        assert!(r["capture"].is_null(), "nothing captured: {r}");
        let (s, v) = g.raw_call(
            "POST",
            &format!("/v1/tokens/{id}/approve"),
            Some(json!({"comment": "ok"})),
        );
        assert_eq!(s, 409, "{v}");
        let why = v["error"].as_str().unwrap_or("");
        assert!(
            why.starts_with("patch verified: differs") && why.contains("does not model"),
            "{v}"
        );
        let (s, v) = g.raw_call(
            "POST",
            &format!("/v1/tokens/{id}/reject"),
            Some(json!({"comment": "row security is not ours to add"})),
        );
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["state"], "rejected");
        let (s, v) = g.raw_call(
            "POST",
            &format!("/v1/tokens/{id}/reject"),
            Some(json!({"comment": "twice"})),
        );
        assert_eq!(s, 409, "{v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap_or("")
                .contains("rejected by admin at"),
            "{v}"
        );
    });
}

//! Test harness: runs the real `sandpit` binary against real Postgres processes.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::tempdir as scratch;
pub use scratch::tempdir;

use super::require;
#[allow(unused_imports)]
pub use require::{in_ci, optional, require};

/// A running gateway process.
pub struct Gateway {
    pub child: Option<Child>,
    pub data_dir: PathBuf,
    pub pg_port: u16,
    pub api: String,
    pub admin_key: String,
    _tmp: Option<tempfile::TempDir>,
}

/// A small golden for tests that need their own gateway.
pub const SMALL_GOLDEN: &str = "create table items(id int primary key, name text not null);\n\
insert into items select g, 'item ' || g from generate_series(1, 1000) g;\n";

impl Gateway {
    /// Start a gateway on a fresh data dir. `golden` None = the demo golden.
    pub fn start(golden: Option<&str>, config: Option<&str>) -> Gateway {
        let tmp = tempdir();
        let dir = tmp.path().to_path_buf();
        let mut g = Gateway::start_in(&dir, golden, config);
        g._tmp = Some(tmp);
        g
    }

    /// Start a gateway on a given data dir (for restarts).
    pub fn start_in(dir: &Path, golden: Option<&str>, config: Option<&str>) -> Gateway {
        Gateway::start_in_with(dir, golden, config, &[], &[])
    }

    /// Start a gateway on a fresh data dir with extra `serve` arguments and environment.
    pub fn start_with(
        golden: Option<&str>,
        config: Option<&str>,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Gateway {
        let tmp = tempdir();
        let dir = tmp.path().to_path_buf();
        let mut g = Gateway::start_in_with(&dir, golden, config, args, envs);
        g._tmp = Some(tmp);
        g
    }

    /// Like `start_in`, with extra `serve` arguments and environment variables.
    pub fn start_in_with(
        dir: &Path,
        golden: Option<&str>,
        config: Option<&str>,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Gateway {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandpit"));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(dir)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--api-listen")
            .arg("127.0.0.1:0")
            .env("SANDPIT_LOG", "info,sandpit=debug")
            .env_remove("SANDPIT_ADMIN_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(dir.join("gateway.log"))
                    .expect("log"),
            ));
        if let Some(sql) = golden {
            let p = dir.join("golden.sql");
            std::fs::write(&p, sql).expect("write golden");
            cmd.arg("--golden-sql").arg(p);
        }
        if let Some(c) = config {
            let p = dir.join("sandpit.toml");
            std::fs::write(&p, c).expect("write config");
            cmd.arg("--config").arg(p);
        }
        cmd.args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        // If the test process dies, the gateway gets SIGTERM and stops its backends.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn sandpit");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("sandpit ready") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(240)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(dir.join("gateway.log")).unwrap_or_default();
                panic!("gateway did not become ready; log:\n{log}");
            }
        };
        // "sandpit ready postgres=127.0.0.1:P api=http://127.0.0.1:Q"
        let pg = line
            .split("postgres=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .expect("pg addr");
        let api = line
            .split("api=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .expect("api")
            .to_string();
        let pg_port = pg
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        let admin_key = std::fs::read_to_string(dir.join("admin.key"))
            .expect("admin key")
            .trim()
            .to_string();
        Gateway {
            child: Some(child),
            data_dir: dir.to_path_buf(),
            pg_port,
            api,
            admin_key,
            _tmp: None,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("gateway.log")).unwrap_or_default()
    }

    /// The gateway's last WARN and ERROR lines (at most 40), for a failing test's message: a
    /// client sees only "could not start the scratch database", the cause is in this log.
    pub fn log_problems(&self) -> String {
        let log = self.log();
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        bad[bad.len().saturating_sub(40)..].join("\n")
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map_or(Body::None, Body::Json);
        let url = format!("{}{}", self.api, path);
        match http(method, &url, Some(&self.admin_key), body) {
            Ok(r) => (
                r.status,
                serde_json::from_str(&r.body).unwrap_or(Value::Null),
            ),
            Err(e) => panic!("api call failed: {e}"),
        }
    }

    /// Issue a token through the HTTP API.
    pub fn issue(&self, task: &str, ttl_seconds: u64) -> Value {
        self.issue_with(serde_json::json!({"task": task, "ttl_seconds": ttl_seconds}))
    }

    pub fn issue_with(&self, body: Value) -> Value {
        let (s, v) = self.call("POST", "/v1/tokens", Some(body));
        assert_eq!(s, 201, "{v}");
        v
    }

    pub fn show(&self, id: &str) -> Value {
        self.call("GET", &format!("/v1/tokens/{id}"), None).1
    }

    pub fn revoke(&self, id: &str) -> (u16, Value) {
        self.call("DELETE", &format!("/v1/tokens/{id}"), None)
    }

    pub fn raw_call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call(method, path, body)
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// SIGKILL, no cleanup.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn instances_dir(&self) -> PathBuf {
        self.data_dir.join("pg").join("instances")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts a gateway with `start` on a thread that lives as long as the test process (so the
/// gateway's PDEATHSIG fires only when the process ends) and keeps it for the whole process.
pub fn process_gateway(start: impl FnOnce() -> Gateway + Send + 'static) -> &'static Gateway {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let leaked: &'static Gateway = Box::leak(Box::new(start()));
        stop_at_exit(leaked);
        let _ = tx.send(leaked as *const Gateway as usize);
        loop {
            std::thread::park();
        }
    });
    let p = rx.recv().expect("gateway thread");
    // SAFETY: leaked above, never freed.
    unsafe { &*(p as *const Gateway) }
}

/// Process-long gateways to stop when the test process exits: (pid, data dir, remove dir).
static AT_EXIT: std::sync::Mutex<Vec<(i32, PathBuf, bool)>> = std::sync::Mutex::new(Vec::new());

/// Stops `g` (SIGTERM, then SIGKILL and its servers after 20 s) when the test process exits,
/// passing or failing, and removes its data dir if it is a scratch one. Statics are never
/// dropped, so without this a leaked gateway's directory would outlive the run.
fn stop_at_exit(g: &Gateway) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    let Some(child) = g.child.as_ref() else {
        return;
    };
    let scratch = g._tmp.is_some();
    if let Ok(mut v) = AT_EXIT.lock() {
        v.push((child.id() as i32, g.data_dir.clone(), scratch));
    }
    extern "C" fn stop_all() {
        let Ok(v) = AT_EXIT.lock() else { return };
        for (pid, _, _) in v.iter() {
            unsafe { libc::kill(*pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for (pid, dir, scratch) in v.iter() {
            loop {
                let mut status = 0;
                let r = unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) };
                if r != 0 {
                    break;
                }
                if Instant::now() > deadline {
                    unsafe { libc::kill(*pid, libc::SIGKILL) };
                    unsafe { libc::waitpid(*pid, &mut status, 0) };
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            scratch::stop_servers_under(dir, 6);
            if *scratch {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
    HOOK.call_once(|| unsafe {
        libc::atexit(stop_all);
    });
}

/// A data dir under target/ that outlives runs (so its golden is built once), emptied of
/// what the previous run left in `subs`.
pub fn reused_dir(name: &str, subs: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    for sub in subs {
        let p = dir.join(sub);
        let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
    }
    std::fs::create_dir_all(&dir).expect("gateway dir");
    dir
}

/// The demo-golden gateway shared by the tests of one test binary.
pub fn shared() -> &'static Gateway {
    static G: OnceLock<Gateway> = OnceLock::new();
    G.get_or_init(|| {
        let g = process_gateway(|| {
            let dir = reused_dir("shared-gateway", &["tokens", "pg/instances", "gateway.log"]);
            Gateway::start_in(&dir, None, None)
        });
        Gateway {
            child: None,
            data_dir: g.data_dir.clone(),
            pg_port: g.pg_port,
            api: g.api.clone(),
            admin_key: g.admin_key.clone(),
            _tmp: None,
        }
    })
}

/// Connect with tokio-postgres (no TLS).
pub async fn connect(dsn: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// The SQLSTATE of a tokio-postgres error.
pub fn sqlstate(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        eprintln!("db error: {} {}", db.code().code(), db.message());
    }
    e.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| format!("(no code: {e})"))
}

/// A connection attempt's outcome as far as a client sees it: `select 1` on the session it
/// opened, or the SQLSTATE that refused it (the connection's task is spawned).
pub async fn select_1_on<S, T>(
    connected: Result<
        (tokio_postgres::Client, tokio_postgres::Connection<S, T>),
        tokio_postgres::Error,
    >,
) -> Result<(), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (c, conn) = connected.map_err(|e| sqlstate(&e))?;
    tokio::spawn(conn);
    c.simple_query("select 1")
        .await
        .map(|_| ())
        .map_err(|e| sqlstate(&e))
}

/// A login as `user`/`password` on the gateway listening on `port` and one `SELECT 1`:
/// its value, or the refusal as (SQLSTATE, message).
pub async fn login_at(port: u16, user: &str, password: &str) -> Result<i32, (String, String)> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host("127.0.0.1")
        .port(port)
        .user(user)
        .password(password)
        .dbname("sandpit");
    let fail = |e: tokio_postgres::Error| {
        let msg = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string());
        (sqlstate(&e), msg)
    };
    let (c, conn) = cfg.connect(tokio_postgres::NoTls).await.map_err(fail)?;
    tokio::spawn(conn);
    let row = c.query_one("SELECT 1", &[]).await.map_err(fail)?;
    Ok(row.get(0))
}

/// Run psql with a DSN; returns (success, stdout, stderr).
pub fn psql(dsn: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("psql")
        .arg(dsn)
        .args(["-X", "-v", "ON_ERROR_STOP=1", "-At"])
        .args(args)
        .env_remove("PGPASSWORD")
        .output()
        .expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// `GET /metrics` parsed into `name{labels}` → value (labels as rendered).
pub fn metrics(api: &str) -> std::collections::BTreeMap<String, f64> {
    let text = http_ok("GET", &format!("{api}/metrics"), None, Body::None)
        .expect("GET /metrics")
        .body;
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Pids of processes whose cwd or command line points into `dir` (Postgres servers chdir to
/// their data dir).
pub fn processes_in(dir: &Path) -> Vec<i32> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if !pid_alive(pid) {
            continue;
        }
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cwd.starts_with(&dir) || cmd.contains(dir.to_string_lossy().as_ref()) {
            out.push(pid);
        }
    }
    out
}

/// Waits (up to a minute) until a statement with exactly this text runs, as seen by
/// `watcher`'s `pg_stat_activity` (so a cancel, revoke or kill meets it running, however
/// slow the machine).
pub async fn wait_running(watcher: &tokio_postgres::Client, text: &str) {
    let seen = async {
        loop {
            let n: i64 = watcher
                .query_one(
                    "select count(*) from pg_stat_activity where state = 'active' and query = $1",
                    &[&text],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            if n > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), seen)
        .await
        .expect("statement seen running");
}

/// The DSN of a token pointed at a (restarted) gateway's port.
pub fn redial(t: &Value, g: &Gateway) -> String {
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    let (head, tail) = dsn.rsplit_once('@').expect("dsn host");
    let db = tail.split_once('/').map(|x| x.1).unwrap_or("sandpit");
    format!("{head}@127.0.0.1:{}/{db}", g.pg_port)
}

/// Pid and socket dir from a token's instance `postmaster.pid`.
pub fn postmaster(g: &Gateway, token: &str) -> Option<(i32, PathBuf)> {
    let text = std::fs::read_to_string(
        g.instances_dir()
            .join(token)
            .join("data")
            .join("postmaster.pid"),
    )
    .ok()?;
    let mut lines = text.lines();
    let pid = lines.next()?.trim().parse().ok()?;
    let sock = PathBuf::from(lines.nth(3)?.trim());
    Some((pid, sock))
}

/// Connect, run `sql`, return the first column of the first row as text.
pub async fn query_one(dsn: &str, sql: &str) -> Result<Option<String>, tokio_postgres::Error> {
    let c = connect(dsn).await?;
    let rows = c.simple_query(sql).await?;
    Ok(rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    }))
}

/// Run the `sandpit` binary (without an inherited admin key); returns (code, stdout, stderr).
pub fn run_sandpit(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sandpit"))
        .args(args)
        .env_remove("SANDPIT_ADMIN_KEY")
        .envs(envs.iter().copied())
        .output()
        .expect("run sandpit");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Wait for a child to exit; kills it and returns None after `limit`.
pub fn wait_exit(c: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    None
}

/// A request body for [`http`].
pub enum Body<'a> {
    None,
    Json(Value),
    Form(&'a [(&'a str, &'a str)]),
}

/// One HTTP answer of [`http`], whatever its status (4xx and 5xx are answers, not errors).
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

/// Send one request with `reqwest`'s blocking client, with `Authorization: Bearer` when
/// given; `Err` only when no answer was read (connection refused, body cut short).
///
/// It runs on a thread of its own because `reqwest::blocking` panics when created or dropped
/// inside a tokio runtime, and the helpers here are called from `#[tokio::test]`s too. No
/// proxy and no timeout, as the gateway is local and a loaded machine may be slow.
pub fn http(method: &str, url: &str, bearer: Option<&str>, body: Body) -> Result<Reply, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let client = reqwest::blocking::Client::builder()
                .no_proxy()
                .timeout(None)
                .build()
                .map_err(|e| e.to_string())?;
            let method =
                reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
            let mut req = client.request(method, url);
            if let Some(b) = bearer {
                req = req.header("Authorization", format!("Bearer {b}"));
            }
            req = match body {
                Body::None => req,
                Body::Json(v) => req.json(&v),
                Body::Form(f) => req.form(f),
            };
            let res = req.send().map_err(|e| format!("{url}: {e}"))?;
            let status = res.status().as_u16();
            let headers = res.headers().clone();
            let body = res.text().map_err(|e| format!("{url}: body: {e}"))?;
            Ok(Reply {
                status,
                headers,
                body,
            })
        })
        .join()
        .unwrap_or_else(|_| Err("http thread panicked".to_string()))
    })
}

/// [`http`] for calls that must succeed: a 4xx or 5xx answer is an error too.
pub fn http_ok(method: &str, url: &str, bearer: Option<&str>, body: Body) -> Result<Reply, String> {
    let r = http(method, url, bearer, body)?;
    if r.status >= 400 {
        return Err(format!("{method} {url}: {} {}", r.status, r.body));
    }
    Ok(r)
}

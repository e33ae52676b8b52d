//! The `instance` provider against real PostgreSQL servers: forks are isolated from each other,
//! the agent role is contained, destroy is fast and complete, stop/ensure_running keep data, and
//! the golden is built once per root. One test function, because the golden build is slow.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandpit::provider::instance::{InstanceConfig, InstanceProvider};
use sandpit::provider::{Backend, BackendTag, Provider, ProviderError};
use tokio_postgres::{Client, NoTls};

use crate::support::require;

fn tag(id: &str) -> BackendTag {
    BackendTag {
        token_id: id.into(),
        task: format!("task-{id}"),
        expires_at: "2030-01-01T00:00:00Z".into(),
        gateway_id: "test".into(),
        golden: None,
    }
}

async fn connect(b: &Backend, user: &str, db: &str) -> Result<Client, tokio_postgres::Error> {
    let dir = b
        .target
        .socket_path()
        .and_then(|p| p.parent())
        .expect("socket dir");
    let (client, conn) = tokio_postgres::Config::new()
        .host_path(dir)
        .port(5432)
        .user(user)
        .dbname(db)
        .connect(NoTls)
        .await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

async fn count(c: &Client, table: &str) -> i64 {
    c.query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .expect("count")
        .get(0)
}

fn postmaster_pid(p: &InstanceProvider, handle: &str) -> i32 {
    let f = p
        .real_root()
        .join("instances")
        .join(handle)
        .join("data/postmaster.pid");
    std::fs::read_to_string(f)
        .expect("postmaster.pid")
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Kills every server under the root and removes the real root (the fallback dir lives in
/// /var/tmp, outside the tempdir), even when an assertion failed half way.
struct Cleanup(Option<PathBuf>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(root) = self.0.take() else { return };
        if let Ok(rd) = std::fs::read_dir(root.join("instances")) {
            for e in rd.flatten() {
                if let Ok(s) = std::fs::read_to_string(e.path().join("data/postmaster.pid")) {
                    if let Some(pid) = s.lines().next().and_then(|l| l.trim().parse::<i32>().ok()) {
                        unsafe { libc::kill(-pid, libc::SIGKILL) };
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_provider_end_to_end() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Private like a home directory: the postgres user cannot traverse it.
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let root = tmp.path().join("pg");
    let sql = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/demo_golden.sql");
    let cfg = InstanceConfig::new(&root, &sql);

    let t0 = Instant::now();
    let p = InstanceProvider::new(cfg.clone()).await.expect("provider");
    let mut cleanup = Cleanup(Some(p.real_root().to_path_buf()));
    println!(
        "golden ready in {:?}; copy method {}; netns {}; real root {}",
        t0.elapsed(),
        p.copy_method(),
        p.netns(),
        p.real_root().display()
    );
    let is_root = nix::unistd::geteuid().is_root();
    if is_root {
        // The tempdir is 0700: the root must have been redirected to a reachable fallback.
        assert!(std::fs::symlink_metadata(&root)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(p.real_root().starts_with("/var/tmp"));
    }
    let golden_mtime = std::fs::metadata(p.golden_dir()).unwrap().mtime_nsec();

    // Two forks.
    let t = Instant::now();
    let a = p.fork(&tag("tok-a")).await.expect("fork a");
    println!("fork a: {:?} ({})", t.elapsed(), a.method);
    let t = Instant::now();
    let b = p.fork(&tag("tok-b")).await.expect("fork b");
    println!("fork b: {:?} ({})", t.elapsed(), b.method);
    assert_eq!(a.target.user, "agent");
    assert_eq!(a.target.database, "sandpit");
    assert!(a.target.password.is_none());
    assert_ne!(a.target.socket_path(), b.target.socket_path());
    let sock_meta =
        std::fs::metadata(a.target.socket_path().and_then(|p| p.parent()).unwrap()).unwrap();
    assert_eq!(
        sock_meta.mode() & 0o777,
        0o700,
        "socket dir must be private"
    );
    if is_root {
        assert_ne!(
            sock_meta.uid(),
            0,
            "socket dir belongs to the postgres user"
        );
    }
    match p.fork(&tag("tok-a")).await {
        Err(ProviderError::Fork(_)) => {}
        other => panic!("forking an existing token must fail, got {other:?}"),
    }
    assert!(
        p.fork(&tag("../evil")).await.is_err(),
        "path-like handles are refused"
    );

    // A long handle makes the socket path too long for sun_path: the socket goes under /tmp.
    let long = "l".repeat(60);
    let l = p.fork(&tag(&long)).await.expect("fork long");
    assert!(
        l.target
            .socket_path()
            .map(|p| p.to_string_lossy().to_string())
            .unwrap_or_default()
            .starts_with("/tmp/sandpit-s-"),
        "{:?}",
        l.target.socket_path()
    );
    let cl = connect(&l, "agent", "sandpit").await.expect("connect long");
    assert_eq!(count(&cl, "products").await, 1000);
    drop(cl);
    p.destroy(&long).await.expect("destroy long");
    assert!(
        !l.target
            .socket_path()
            .and_then(|p| p.parent())
            .unwrap()
            .exists(),
        "socket dir removed"
    );

    // Isolation: a destructive statement in a leaves b at the golden count.
    let ca = connect(&a, "agent", "sandpit").await.expect("connect a");
    let cb = connect(&b, "agent", "sandpit").await.expect("connect b");
    let golden_orders = count(&cb, "orders").await;
    assert!(
        golden_orders >= 100_000,
        "golden has {golden_orders} orders"
    );
    assert_eq!(count(&ca, "orders").await, golden_orders);
    let pending: i64 = cb
        .query_one("SELECT count(*) FROM orders WHERE status = 'pending'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        (15..=25).contains(&(pending * 100 / golden_orders)),
        "pending share {pending}/{golden_orders}"
    );
    let t = Instant::now();
    ca.batch_execute("DELETE FROM orders")
        .await
        .expect("delete in a");
    println!("DELETE FROM orders in a: {:?}", t.elapsed());
    assert_eq!(count(&ca, "orders").await, 0);
    assert_eq!(count(&cb, "orders").await, golden_orders);

    // Containment of the agent role.
    let err = ca.batch_execute("COPY (SELECT 1) TO PROGRAM 'true'").await;
    assert!(err.is_err(), "agent must not run programs");
    assert!(
        connect(&a, "agent", "postgres").await.is_err(),
        "agent must not reach db postgres"
    );
    let su: bool = ca
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!su);

    // Network containment, proven with the superuser: a listener that is reachable from here
    // must not be reachable from inside the instance.
    let admin = connect(&a, p.superuser(), "sandpit")
        .await
        .expect("connect admin");
    admin
        .batch_execute("COPY (SELECT 1) TO PROGRAM 'cat >/dev/null'")
        .await
        .expect("admin can run programs");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("reachable from the host");
    let probe = format!("COPY (SELECT 1) TO PROGRAM 'bash -c \"exec 3<>/dev/tcp/127.0.0.1/{port} && cat >/dev/null\"'");
    let net = admin.batch_execute(&probe).await;
    if require::require(a.netns, "a network namespace", "needs root (CAP_SYS_ADMIN)") {
        assert!(net.is_err(), "instance in a netns reached 127.0.0.1:{port}");
    }
    drop(admin);

    // stop + ensure_running keeps data.
    cb.batch_execute("CREATE TABLE note (t text); INSERT INTO note VALUES ('kept')")
        .await
        .unwrap();
    drop(cb);
    p.stop("tok-b").await.expect("stop b");
    p.stop("tok-b").await.expect("stop is idempotent");
    let t = Instant::now();
    let b2 = p.ensure_running("tok-b").await.expect("ensure b");
    println!(
        "ensure_running after stop: {:?} ({})",
        t.elapsed(),
        b2.method
    );
    assert_eq!(b2.method, "restart");
    let cb = connect(&b2, "agent", "sandpit").await.expect("reconnect b");
    let kept: String = cb
        .query_one("SELECT t FROM note", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, "kept");
    assert_eq!(count(&cb, "orders").await, golden_orders);
    assert_eq!(p.ensure_running("tok-b").await.unwrap().method, "adopted");

    // A crashed server (SIGKILL to its whole group) is restarted with crash recovery.
    drop(cb);
    let crashed = postmaster_pid(&p, "tok-b");
    unsafe { libc::kill(-crashed, libc::SIGKILL) };
    let t = Instant::now();
    while sandpit::pg::process::pid_alive(crashed) && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let b3 = p.ensure_running("tok-b").await.expect("ensure after crash");
    assert_eq!(b3.method, "restart");
    let cb = connect(&b3, "agent", "sandpit")
        .await
        .expect("reconnect after crash");
    let kept: String = cb
        .query_one("SELECT t FROM note", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, "kept");

    // list() sees both with their tags.
    let listed = p.list().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], ("tok-a".to_string(), Some(tag("tok-a"))));
    assert_eq!(listed[1].1.as_ref().unwrap().task, "task-tok-b");
    let secrets = p.secrets();
    assert!(secrets.iter().any(|s| s == "sandpit_admin"));
    assert!(secrets.iter().any(|s| Path::new(s) == p.real_root()));

    // destroy is fast and complete.
    drop(ca);
    let pid_a = postmaster_pid(&p, "tok-a");
    let t = Instant::now();
    p.destroy("tok-a").await.expect("destroy a");
    let took = t.elapsed();
    println!("destroy a: {took:?}");
    assert!(
        !Path::new(&format!("/proc/{pid_a}")).exists(),
        "postmaster {pid_a} still there"
    );
    assert!(!p.real_root().join("instances/tok-a").exists());
    assert!(!a.target.socket_path().is_some_and(|p| p.exists()));
    p.destroy("tok-a").await.expect("destroy is idempotent");
    assert!(matches!(
        p.ensure_running("tok-a").await,
        Err(ProviderError::NotFound(_))
    ));

    // A second provider on the same root reuses the golden and adopts the running instance.
    let t = Instant::now();
    let p2 = InstanceProvider::new(cfg.clone())
        .await
        .expect("second provider");
    println!("second provider ready in {:?}", t.elapsed());
    assert_eq!(p2.golden_dir(), p.golden_dir());
    assert_eq!(
        std::fs::metadata(p2.golden_dir()).unwrap().mtime_nsec(),
        golden_mtime,
        "golden was rebuilt"
    );
    assert_eq!(p2.ensure_running("tok-b").await.unwrap().method, "adopted");
    drop(cb);
    let pid_b = postmaster_pid(&p2, "tok-b");
    let t = Instant::now();
    p2.destroy("tok-b")
        .await
        .expect("destroy b from the second provider");
    println!("destroy b (pid only): {:?}", t.elapsed());
    // Let the first provider reap its (now exited) child before checking /proc.
    p.destroy("tok-b")
        .await
        .expect("idempotent from the first provider too");
    assert!(
        !Path::new(&format!("/proc/{pid_b}")).exists(),
        "postmaster {pid_b} still there"
    );
    assert!(p2.list().await.unwrap().is_empty());

    // Control for the network check: the same probe from an instance outside a netns connects,
    // so the failure above is the namespace and not a broken probe.
    if a.netns {
        let p3 = InstanceProvider::new(InstanceConfig {
            netns: false,
            ..cfg.clone()
        })
        .await
        .expect("third provider");
        let c = p3.fork(&tag("tok-c")).await.expect("fork c");
        assert!(!c.netns);
        let admin = connect(&c, p3.superuser(), "sandpit")
            .await
            .expect("connect admin c");
        admin
            .batch_execute(&probe)
            .await
            .expect("without netns the listener is reachable");
        drop(admin);
        p3.destroy("tok-c").await.expect("destroy c");
    }

    drop(cleanup.0.take().map(std::fs::remove_dir_all));
}

//! The `microvm` provider beyond the spine (which `tests/providers.rs` runs on it): a warm
//! pool of restored VMs, a VM stopped by a gateway shutdown booting again from its own
//! disk with the task's data, and a superuser token whose power stays inside its own VM.

mod common;
#[path = "support/microvm_checks.rs"]
mod microvm_checks;

use common::{connect, sqlstate, Gateway, SMALL_GOLDEN};
use serde_json::Value;

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

#[test]
fn warm_pool_on_microvm() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let cfg = microvm_checks::config(&rt) + "[pool]\nsize = 1\n";
    let g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    rt.block_on(microvm_checks::warm_pool(&g));
}

/// Shutdown stops the VM (QMP quit, disk kept); the next connection after a restart boots
/// it from its own overlay (its memory state is gone; Postgres recovers) with the data.
#[test]
fn restart_on_microvm() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let cfg = microvm_checks::config(&rt);
    let tmp = common::tempdir();
    let mut g = Gateway::start_in(tmp.path(), Some(SMALL_GOLDEN), Some(&cfg));
    let t = g.issue("vm-restart", 3600);
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        c.batch_execute("create table kept(x int); insert into kept values (42)")
            .await
            .expect("write");
    });
    g.stop();
    let vm = microvm_checks::vm_dir(&g, &id(&t));
    assert!(vm.join("disk.qcow2").exists(), "stop keeps the VM's disk");
    let pid = std::fs::read_to_string(vm.join("qemu.pid")).unwrap_or_default();
    assert!(
        pid.trim().is_empty() || !std::path::Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "the VM was stopped with the gateway"
    );
    let g2 = Gateway::start_in(tmp.path(), Some(SMALL_GOLDEN), Some(&cfg));
    let d = dsn(&t).replace(&format!(":{}/", g.pg_port), &format!(":{}/", g2.pg_port));
    rt.block_on(async {
        let c = connect(&d).await.expect("connect after restart");
        let x: i32 = c
            .query_one("select x from kept", &[])
            .await
            .expect("the table survived")
            .get(0);
        assert_eq!(x, 42);
    });
    drop(g2);
}

/// The first column of the only row of `sql`, as text.
async fn text(c: &tokio_postgres::Client, sql: &str) -> String {
    c.query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// What every clone of the golden must still show: the golden's rows, its `postgres`
/// database, and the default `work_mem`.
async fn golden_view(c: &tokio_postgres::Client) -> (String, String, String) {
    (
        text(c, "select count(*)::text from items").await,
        text(
            c,
            "select count(*)::text from pg_database where datname = 'postgres'",
        )
        .await,
        text(c, "show work_mem").await,
    )
}

/// A superuser token is a superuser of its own VM (an ordinary token beside it is not);
/// programs and files it reaches are the guest's, the guest has no network interface but
/// `lo`, and what it destroys (another database, golden tables, the server's config, the
/// server itself) changes neither another token's clone nor a fresh fork of the golden.
#[test]
fn a_superuser_token_acts_only_inside_its_own_vm() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let cfg = microvm_checks::config(&rt);
    let g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    // No accel in the config: the default, `auto`, decided and said why.
    assert!(
        g.log().contains("microvm accelerator: auto: "),
        "{}",
        g.log()
    );
    let su =
        g.issue_with(serde_json::json!({"task": "vm-su", "ttl_seconds": 600, "superuser": true}));
    assert_eq!(su["superuser"], Value::Bool(true), "{su}");
    assert_eq!(g.show(&id(&su))["superuser"], Value::Bool(true));
    let plain = g.issue("vm-plain", 600);
    assert_eq!(plain["superuser"], Value::Bool(false), "{plain}");
    let host_marker = std::env::temp_dir().join(format!("sandpit-pwned-{}", id(&su)));
    let _ = std::fs::remove_file(&host_marker);
    rt.block_on(async {
        let a = connect(&dsn(&su)).await.expect("connect superuser token");
        let b = connect(&dsn(&plain)).await.expect("connect plain token");
        let is_super = "select rolsuper::text from pg_roles where rolname = current_user";
        assert_eq!(text(&a, is_super).await, "true");
        assert_eq!(text(&b, is_super).await, "false");
        let e = b
            .batch_execute("copy (select 1) to program 'true'")
            .await
            .expect_err("an ordinary token runs no program");
        assert_eq!(sqlstate(&e), "42501", "{e}");
        let before = golden_view(&b).await;

        // A program run by the superuser writes the guest's /tmp, not the host's.
        let marker = host_marker.to_string_lossy().to_string();
        a.batch_execute(&format!("copy (select 1) to program 'echo x > {marker}'"))
            .await
            .expect("copy to program");
        let written: String = a
            .query_one("select pg_read_file($1)", &[&marker])
            .await
            .expect("the guest has the file")
            .get(0);
        assert_eq!(written.trim(), "x");
        assert!(!host_marker.exists(), "the program wrote on the host");
        // Its files are the guest's.
        let guest_name = text(&a, "select pg_read_file('/etc/hostname')").await;
        let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
        assert_ne!(guest_name.trim(), host_name.trim());
        // No network interface but loopback.
        a.batch_execute(
            "create temp table net(name text); copy net from program 'ls /sys/class/net'",
        )
        .await
        .expect("list interfaces");
        let names: Vec<String> = a
            .query("select name from net order by name", &[])
            .await
            .expect("interfaces")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(names, ["lo"]);

        // Destruction inside a: another database, the golden's table, the config, a restart.
        // One statement per query: DROP DATABASE and ALTER SYSTEM refuse a transaction block.
        for sql in [
            "drop database postgres",
            "drop table items",
            "alter system set work_mem = '7MB'",
            "select pg_reload_conf()",
        ] {
            a.batch_execute(sql)
                .await
                .unwrap_or_else(|e| panic!("superuser in its own VM: {sql}: {e}"));
        }
        let auto = text(&a, "select pg_read_file('postgresql.auto.conf')").await;
        assert!(auto.contains("work_mem = '7MB'"), "{auto}");
        let e = a
            .batch_execute("select 1 from items")
            .await
            .expect_err("items dropped in a");
        assert_eq!(sqlstate(&e), "42P01", "{e}");
        // A restart of the guest's server, detached so that the COPY returns first; the
        // session may end with it either way.
        let _ = a
            .batch_execute(
                "copy (select 1) to program 'nohup /usr/lib/postgresql/15/bin/pg_ctl \
                 -D /var/lib/postgresql/15/main -m fast restart >/dev/null 2>&1 &'",
            )
            .await;
        drop(a);

        assert_eq!(golden_view(&b).await, before, "b changed with a");
        let c = g.issue("vm-fresh", 600);
        let cc = connect(&dsn(&c)).await.expect("connect fresh fork");
        assert_eq!(golden_view(&cc).await, before, "the golden changed with a");
        assert_eq!(text(&cc, is_super).await, "false");
    });
    assert!(!host_marker.exists(), "the program wrote on the host");
}

/// Idle suspend: a VM without sessions is stopped (its QEMU gone, its disk overlay kept)
/// and the next connection boots it again from its own disk, with the task's data.
#[test]
fn an_idle_vm_is_suspended_and_resumes_with_its_data() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let cfg = microvm_checks::config(&rt).replace(
        "[microvm]\n",
        "[postgres]\nidle_suspend = \"2s\"\n[microvm]\n",
    );
    let g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let t = g.issue("vm-sleepy", 600);
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        c.batch_execute("create table kept(x int); insert into kept values (7)")
            .await
            .expect("write");
    });
    let vm = microvm_checks::vm_dir(&g, &id(&t));
    let pid: i32 = std::fs::read_to_string(vm.join("qemu.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("qemu pid");
    assert!(
        common::pid_alive(pid),
        "the VM runs after its first session"
    );
    // Suspended: QEMU is gone, the VM's overlay stays.
    assert!(
        common::wait_until(std::time::Duration::from_secs(120), || !common::pid_alive(
            pid
        )),
        "not suspended:\n{}",
        g.log()
    );
    assert!(
        vm.join("disk.qcow2").is_file(),
        "suspend keeps the VM's disk"
    );
    assert!(
        common::wait_until(std::time::Duration::from_secs(30), || g
            .log()
            .contains("backend suspended while idle")),
        "{}",
        g.log()
    );
    // The next connection boots it from its disk before its first query.
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect after suspend");
        assert_eq!(text(&c, "select x::text from kept").await, "7");
    });
    assert_eq!(
        g.show(&id(&t))["fork_count"],
        1,
        "resumed, not forked again"
    );
}

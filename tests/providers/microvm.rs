//! The `microvm` provider beyond the spine (which `tests/providers/spines.rs` runs on it): a warm
//! pool of restored VMs, a VM stopped by a gateway shutdown booting again from its own
//! disk with the task's data, a superuser token whose power stays inside its own VM, idle
//! suspend, and golden versions built from a live database.

use crate::support::harness;
use crate::support::microvm_checks;
use crate::support::shared_pg;

use crate::support::harness::{connect, sqlstate, Gateway, SMALL_GOLDEN};
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
    let tmp = harness::tempdir();
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
        harness::pid_alive(pid),
        "the VM runs after its first session"
    );
    // Suspended: QEMU is gone, the VM's overlay stays.
    assert!(
        harness::wait_until(std::time::Duration::from_secs(120), || !harness::pid_alive(
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
        harness::wait_until(std::time::Duration::from_secs(30), || g
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

/// The review's patch of a token, against the reference of its own golden version.
fn patch(g: &Gateway, token: &str) -> String {
    let (s, body) = g.raw_call("GET", &format!("/v1/tokens/{token}/diff"), None);
    assert_eq!(s, 200, "{body}");
    body["patch"].as_str().expect("patch").to_string()
}

/// Builds a version from `dsn` (masked by `mask`, TOML rules) and makes it the one new
/// forks restore.
fn build_and_use(g: &Gateway, dsn: &str, mask: &str) -> String {
    let (s, v) = g.raw_call(
        "POST",
        "/v1/goldens",
        Some(serde_json::json!({ "from_dsn": dsn, "mask": mask })),
    );
    assert_eq!(s, 201, "{v}\n{}", g.log());
    assert_eq!(v["kind"], "live", "{v}");
    assert_eq!(v["active"], false, "{v}");
    let v_id = id(&v);
    let (s, used) = g.raw_call("POST", &format!("/v1/goldens/{v_id}/use"), None);
    assert_eq!(s, 200, "{used}");
    assert_eq!(used["active"], true, "{used}");
    v_id
}

/// Whether any file directly in `dir` holds `needle` (grep: the memory file is large).
fn dir_holds(dir: &std::path::Path, needle: &str) -> bool {
    std::process::Command::new("grep")
        .args(["-r", "-q", "-a", "-F", needle])
        .arg(dir)
        .status()
        .expect("grep")
        .success()
}

/// Golden versions: v1 and v2 are snapshots of golden VMs filled from a live source at two
/// moments, v1 masked (no original value of a masked column in any of its files, while the
/// unmasked v2's files do hold them). A token issued under v1 keeps it after v2 is put in use, one issued after gets
/// v2, the review of each compares against its own version, and v1's snapshot goes once
/// no clone or pin names it.
#[test]
fn golden_versions_on_microvm() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let cfg = microvm_checks::config(&rt);
    rt.block_on(async {
        let src = shared_pg::SharedPg::start().await;
        let admin = src.admin("postgres").await;
        let password = format!("pw-{}", sandpit::auth::new_secret());
        // One statement per call: CREATE DATABASE refuses a transaction block.
        for sql in [
            format!("CREATE ROLE vm_src LOGIN PASSWORD '{password}'"),
            "CREATE DATABASE vmshop OWNER vm_src".to_string(),
        ] {
            admin.batch_execute(&sql).await.expect("source role");
        }
        let shop = src.admin("vmshop").await;
        shop.batch_execute(
            "SET ROLE vm_src; CREATE TABLE things(id int PRIMARY KEY, label text); \
             INSERT INTO things SELECT g, 'zqsecret' || g || 'xq' FROM generate_series(1, 500) g",
        )
        .await
        .expect("source data");
        let source = format!(
            "postgresql://vm_src:{password}@127.0.0.1:{}/vmshop",
            src.port
        );

        let g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
        let v1 = build_and_use(
            &g,
            &source,
            "[columns]\n\"things.label\" = \"constant:hidden\"\n",
        );
        let a = g.issue("vm-ver-a", 600);
        assert_eq!(g.show(&id(&a))["golden"], v1.as_str());
        let ca = connect(&dsn(&a)).await.expect("connect a");
        assert_eq!(text(&ca, "select count(*)::text from things").await, "500");
        assert_eq!(
            text(&ca, "select string_agg(distinct label, ',') from things").await,
            "hidden"
        );
        let e = ca
            .batch_execute("select 1 from items")
            .await
            .expect_err("the SQL golden's table is not in a live version");
        assert_eq!(sqlstate(&e), "42P01", "{e}");
        ca.batch_execute("create table a_marker(x int); insert into a_marker values (42)")
            .await
            .expect("write in a");

        // The source moves on; v2 is built from it and put in use.
        shop.batch_execute("SET ROLE vm_src; INSERT INTO things VALUES (1001, 'only-in-v2')")
            .await
            .expect("source change");
        let v2 = build_and_use(&g, &source, "");
        let b = g.issue("vm-ver-b", 600);
        assert_eq!(g.show(&id(&b))["golden"], v2.as_str());
        let cb = connect(&dsn(&b)).await.expect("connect b");
        assert_eq!(text(&cb, "select count(*)::text from things").await, "501");
        cb.batch_execute("insert into things values (1100, 'b-row')")
            .await
            .expect("write in b");
        assert_eq!(g.show(&id(&b))["golden"], v2.as_str());
        // A keeps v1.
        assert_eq!(text(&ca, "select count(*)::text from things").await, "500");
        assert_eq!(text(&ca, "select x::text from a_marker").await, "42");
        assert_eq!(g.show(&id(&a))["golden"], v1.as_str());
        let named = std::fs::read_to_string(microvm_checks::vm_dir(&g, &id(&a)).join("golden"));
        assert_eq!(
            named.expect("a's golden file").trim(),
            v1,
            "a's clone names its version"
        );

        let (s, list) = g.raw_call("GET", "/v1/goldens", None);
        assert_eq!(s, 200, "{list}");
        let list = list.as_array().cloned().unwrap_or_default();
        let find = |v: &str| list.iter().find(|x| x["id"] == v).cloned().expect(v);
        assert_eq!(list.len(), 3, "{list:?}");
        assert_eq!(list[0]["kind"], "sql");
        assert_eq!(list[0]["active"], false);
        assert_eq!(find(&v1)["active"], false);
        assert_eq!(find(&v1)["forks"], 1);
        assert_eq!(find(&v2)["active"], true);
        assert_eq!(find(&v2)["forks"], 1);

        // Each review compares against its own version: nothing of the other shows.
        let pa = patch(&g, &id(&a));
        assert!(pa.contains("a_marker"), "{pa}");
        assert!(
            !pa.contains("things"),
            "a's review compared against another golden:\n{pa}"
        );
        let pb = patch(&g, &id(&b));
        assert!(pb.contains("b-row"), "{pb}");
        assert!(
            !pb.contains("only-in-v2"),
            "b's review compared against another golden:\n{pb}"
        );
        assert!(!pb.contains("a_marker"), "{pb}");

        // Masking happened in a staging VM: the snapshot's memory, device state and disk
        // hold no original value (and the staging VM is gone). The scan finds them where
        // they are: in the unmasked v2.
        let v1_dir = g.data_dir.join("microvm").join("versions").join(&v1);
        let v2_dir = g.data_dir.join("microvm").join("versions").join(&v2);
        assert!(
            !dir_holds(&v1_dir, "zqsecret"),
            "original values in v1's snapshot"
        );
        assert!(!v1_dir.join("stage").exists());
        assert!(
            dir_holds(&v2_dir, "zqsecret"),
            "the scan finds nothing at all"
        );

        // v1 goes with its last clone (a revoke answers after the collection it triggers).
        assert!(v1_dir.join("mem").is_file());
        drop(ca);
        let (s, _) = g.revoke(&id(&a));
        assert_eq!(s, 200);
        assert!(
            harness::wait_until(std::time::Duration::from_secs(120), || !v1_dir.exists()),
            "v1 still on disk after its last clone ended\n{}",
            g.log()
        );
        assert!(v2_dir.join("mem").is_file() && v2_dir.join("disk.qcow2").is_file());
        assert_eq!(text(&cb, "select count(*)::text from things").await, "502");
        let (s, body) = g.raw_call("POST", &format!("/v1/goldens/{v1}/use"), None);
        assert_eq!(s, 404, "{body}");
        assert!(!g.log().contains(&password), "password in the gateway log");
    });
}

//! The `microvm` provider beyond the spine (which `tests/providers.rs` runs on it): a warm
//! pool of restored VMs, and a VM stopped by a gateway shutdown booting again from its own
//! disk with the task's data.

mod common;
#[path = "support/microvm_checks.rs"]
mod microvm_checks;

use common::{connect, Gateway, SMALL_GOLDEN};
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

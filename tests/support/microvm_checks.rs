//! What the `microvm` provider promises beyond the spine: the guest has no network device,
//! its files are its own, a superuser inside one clone reaches nothing of another clone or
//! of the golden, and clones do not share the snapshot's random stream.

use std::path::PathBuf;

use serde_json::Value;

use super::harness::{connect, sqlstate, Gateway};

/// Where tests keep the built guest image between runs (built once, ~3 minutes).
pub fn image_dir() -> PathBuf {
    std::env::var_os("SANDPIT_MICROVM_IMAGE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/sandpit-microvm-images"))
}

/// Builds the image before the gateway starts (the gateway's start deadline is shorter
/// than a first build) and returns the gateway's config.
pub fn config(rt: &tokio::runtime::Runtime) -> String {
    let dir = image_dir();
    rt.block_on(sandpit::provider::microvm::prepare_image(&dir))
        .unwrap_or_else(|e| panic!("microvm image in {}: {e}", dir.display()));
    format!(
        "provider = \"microvm\"\n[microvm]\nimage_dir = \"{}\"\nboot_timeout = \"600s\"\n",
        dir.display()
    )
}

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

/// A VM's dir (its bridge socket is `.s.PGSQL.5432` in it).
pub fn vm_dir(g: &Gateway, token: &str) -> PathBuf {
    g.data_dir.join("microvm").join("vms").join(token)
}

/// The guest's superuser, through the VM's bridge socket (the host's root only).
async fn guest_admin(g: &Gateway, token: &str) -> tokio_postgres::Client {
    let conn = format!(
        "host={} port=5432 user=sandpit_admin dbname=sandpit",
        vm_dir(g, token).display()
    );
    let (c, task) = tokio_postgres::connect(&conn, tokio_postgres::NoTls)
        .await
        .expect("guest superuser over the bridge");
    tokio::spawn(task);
    c
}

pub async fn isolation(g: &Gateway) {
    let a = g.issue("vm-a", 600);
    let b = g.issue("vm-b", 600);
    let ca = connect(&dsn(&a)).await.expect("connect a");
    let cb = connect(&dsn(&b)).await.expect("connect b");

    // Two clones of one memory snapshot: their random streams must differ.
    let q = "select gen_random_uuid()::text || ' ' || random()::text";
    let ua: String = ca.query_one(q, &[]).await.expect("uuid a").get(0);
    let ub: String = cb.query_one(q, &[]).await.expect("uuid b").get(0);
    assert_ne!(ua, ub, "two clones drew the same random values");

    let admin = guest_admin(g, &id(&a)).await;
    // No network device: the guest's kernel knows only loopback.
    let net: String = admin
        .query_one("select pg_read_file('/proc/net/dev')", &[])
        .await
        .expect("read /proc/net/dev")
        .get(0);
    let ifaces: Vec<String> = net
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|s| s.trim().to_string())
        .collect();
    assert_eq!(ifaces, ["lo"], "{net}");
    // Its files are the guest's own, not the host's.
    let hostname: String = admin
        .query_one("select pg_read_file('/etc/hostname')", &[])
        .await
        .expect("read /etc/hostname")
        .get(0);
    assert_eq!(hostname.trim(), "sandpit-vm");
    let host_file = g.data_dir.join("sandpit.toml");
    let e = admin
        .query_one(
            "select pg_read_file($1)",
            &[&host_file.to_string_lossy().to_string()],
        )
        .await
        .expect_err("a host file is not in the guest");
    assert_eq!(sqlstate(&e), "58P01", "{e}");

    // A superuser of clone a changes its own golden copy: b and a fresh clone never see it.
    admin
        .batch_execute("create table owned_by_a(x int); delete from items")
        .await
        .expect("superuser writes in a");
    let n: i64 = cb
        .query_one("select count(*) from items", &[])
        .await
        .expect("b's rows")
        .get(0);
    assert_eq!(n, 1000);
    let e = cb
        .query("select 1 from owned_by_a", &[])
        .await
        .expect_err("not in b");
    assert_eq!(sqlstate(&e), "42P01");
    let c = g.issue("vm-c", 600);
    let cc = connect(&dsn(&c)).await.expect("connect c");
    let n: i64 = cc
        .query_one("select count(*) from items", &[])
        .await
        .expect("c's rows")
        .get(0);
    assert_eq!(n, 1000, "the golden snapshot was not touched");
    // Restored clocks: the guest's time is the host's, not the snapshot's.
    let skew: f64 = cc
        .query_one(
            "select abs(extract(epoch from now()) - $1::float8)",
            &[&std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_secs_f64()],
        )
        .await
        .expect("clock")
        .get(0);
    assert!(skew < 30.0, "guest clock off by {skew} s");
}

/// VM dirs that exist now, with the token id of their tag.
fn vm_tags(g: &Gateway) -> Vec<(String, String)> {
    let dir = g.data_dir.join("microvm").join("vms");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let tag: Value = std::fs::read(e.path().join("sandpit-tag.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        out.push((
            e.file_name().to_string_lossy().to_string(),
            tag["token_id"].as_str().unwrap_or("").to_string(),
        ));
    }
    out
}

/// A warm pool of restored VMs: a token claims one (re-tagged), revoke destroys it.
pub async fn warm_pool(g: &Gateway) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    // Ready members only (a member's VM dir exists while it is still being restored).
    while super::harness::metrics(&g.api)
        .get("sandpit_pool_ready")
        .copied()
        .unwrap_or(0.0)
        < 1.0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "pool did not fill\n{}",
            g.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let t = g.issue("vm-pooled", 600);
    let c = connect(&dsn(&t)).await.expect("connect");
    let n: i64 = c
        .query_one("select count(*) from items", &[])
        .await
        .expect("rows")
        .get(0);
    assert_eq!(n, 1000);
    assert!(g.log().contains("method=pool("), "{}", g.log());
    let mine: Vec<String> = vm_tags(g)
        .into_iter()
        .filter(|(_, tok)| tok == &id(&t))
        .map(|(h, _)| h)
        .collect();
    assert_eq!(mine.len(), 1, "{:?}", vm_tags(g));
    assert!(mine[0].starts_with("pool-"), "{mine:?}");
    drop(c);
    let (status, _) = g.revoke(&id(&t));
    assert_eq!(status, 200);
    let claimed = g.data_dir.join("microvm/vms").join(&mine[0]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while claimed.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "claimed VM not destroyed on revoke"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

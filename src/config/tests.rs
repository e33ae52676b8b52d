//! Tests of `config`.
use super::*;

#[test]
fn unknown_keys_and_bad_values_name_the_key() {
    let e = toml::from_str::<Config>("lisen = \"1.2.3.4:5\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("lisen"), "{e}");
    let e = toml::from_str::<Config>("[tokens]\nttl = \"soon\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ttl") || e.contains("soon"), "{e}");
    let c: Config = toml::from_str("provider = \"cloud\"").unwrap();
    assert!(c.validate().unwrap_err().to_string().contains("provider"));
    for bad in ["databases = []", "databases = [\"sandpit\", \"\"]"] {
        let c: Config = toml::from_str(bad).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("databases"), "{bad}: {e}");
    }
    let c: Config = toml::from_str("databases = [\"sandpit\", \"shop\"]").unwrap();
    c.validate().unwrap();
    assert_eq!(Config::default().databases, ["*"]);
    let c: Config = toml::from_str("[tokens]\nttl = \"5m\"\nmax_rows = 10").unwrap();
    assert_eq!(c.tokens.ttl, Duration::from_secs(300));
    c.validate().unwrap();
}

#[test]
fn a_tokens_connections_are_bounded_by_what_its_server_admits() {
    // (config, the limit, whether it validates)
    let table: &[(&str, Option<u32>, bool)] = &[
        ("", Some(25), true),
        ("[postgres]\nmax_connections = 12", Some(7), false), // the default 10 is more
        ("[postgres]\nmax_connections = 15", Some(10), true),
        (
            "[postgres]\nmax_connections = 3\n[tokens]\nmax_connections = 1",
            Some(0),
            false,
        ),
        ("[tokens]\nmax_connections_limit = 40", Some(40), true),
        ("[tokens]\nmax_connections_limit = 4", Some(4), false),
        (
            "provider = \"remote\"\n[remote]\nurl = \"http://127.0.0.1:1\"",
            None,
            true,
        ),
    ];
    for (text, limit, ok) in table {
        let c: Config = toml::from_str(text).unwrap();
        assert_eq!(c.max_connections_limit(), *limit, "{text}");
        let v = c.validate();
        assert_eq!(v.is_ok(), *ok, "{text}: {v:?}");
        if let Err(e) = v {
            assert!(e.to_string().contains("tokens.max_connections"), "{e}");
        }
    }
}

#[test]
fn provider_sections_are_checked() {
    let c: Config = toml::from_str("provider = \"template\"").unwrap();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("template.admin_dsn"));
    let c: Config = toml::from_str(
        "provider = \"template\"\n[template]\nadmin_dsn = \"postgresql://a@h/db\"\nsslmode = \"prefer\"",
    )
    .unwrap();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("template.sslmode"));
    let e = toml::from_str::<Config>("[template]\nadmin = \"x\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("admin"), "{e}");
    let e = toml::from_str::<Config>("[remote]\nendpoints = \"x\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("endpoints"), "{e}");
    let c: Config = toml::from_str(
        "provider = \"remote\"\n[remote]\nurl = \"http://127.0.0.1:1/\"\nfork_timeout = \"5s\"",
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.remote.fork_timeout, Duration::from_secs(5));
    let c: Config = toml::from_str("provider = \"remote\"").unwrap();
    assert!(c.validate().unwrap_err().to_string().contains("remote.url"));
}

#[test]
fn shipped_example_config_parses_and_matches_defaults() {
    let c: Config = toml::from_str(include_str!("../../config/sandpit.toml")).unwrap();
    c.validate().unwrap();
    let d = Config::default();
    assert_eq!(c.listen, d.listen);
    assert_eq!(c.tokens.max_rows, d.tokens.max_rows);
    assert_eq!(c.limits.max_message, d.limits.max_message);
    assert_eq!(c.tls.mode, d.tls.mode);
    assert_eq!(c.template.golden, d.template.golden);
    assert_eq!(c.remote.fork_timeout, d.remote.fork_timeout);
    assert_eq!(c.remote.request_timeout, d.remote.request_timeout);
    assert_eq!(c.remote.ttl_grace, d.remote.ttl_grace);
    assert_eq!(c.remote.sslmode, d.remote.sslmode);
    assert_eq!(c.shutdown_grace, d.shutdown_grace);
    assert_eq!(c.janitor.interval, d.janitor.interval);
}

#[test]
fn env_overrides_and_their_errors_name_the_variable() {
    let mut c = Config::default();
    let env = |k: &str| match k {
        "SANDPIT_SHUTDOWN_GRACE" => Some("3s".to_string()),
        "SANDPIT_JANITOR_INTERVAL" => Some("1m".to_string()),
        "SANDPIT_PUBLIC_HOST" => Some("db.example".to_string()),
        _ => None,
    };
    c.apply_env(env).unwrap();
    assert_eq!(c.shutdown_grace, Duration::from_secs(3));
    assert_eq!(c.janitor.interval, Duration::from_secs(60));
    assert_eq!(c.dsn_host(), "db.example");
    let e = c
        .apply_env(|k| (k == "SANDPIT_JANITOR_INTERVAL").then(|| "often".to_string()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("SANDPIT_JANITOR_INTERVAL"), "{e}");
    let c: Config = toml::from_str("[janitor]\ninterval = \"10ms\"").unwrap();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("janitor.interval"));
    let e = toml::from_str::<Config>("[janitor]\nintervall = \"10s\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("intervall"), "{e}");
}

#[test]
fn shared_registry_needs_network_backends_and_no_pool() {
    let tpl = "provider = \"template\"\n[template]\nadmin_dsn = \"postgresql://a@h/db\"\n";
    let url = "[registry]\nurl = \"postgresql://r@h/reg\"\n";
    // The default provider keeps backends on this machine's unix sockets: refused.
    let c: Config = toml::from_str(url).unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("registry.url") && e.contains("instance"), "{e}");
    let c: Config = toml::from_str(&format!("{tpl}{url}")).unwrap();
    c.validate().unwrap();
    let c: Config = toml::from_str(&format!("{tpl}[pool]\nsize = 2\n{url}")).unwrap();
    assert!(c.validate().unwrap_err().to_string().contains("pool.size"));
    let c: Config = toml::from_str(&format!("{tpl}[pool]\nmax_size = 4\n{url}")).unwrap();
    assert!(c.validate().unwrap_err().to_string().contains("pool.size"));
    let c: Config =
        toml::from_str(&format!("{tpl}[registry]\nurl = \"mysql://r@h/reg\"\n")).unwrap();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("registry.url"));
    let c: Config = toml::from_str(&format!("{tpl}{url}sslmode = \"prefer\"\n")).unwrap();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("registry.sslmode"));
    // The file registry stays the default.
    assert!(Config::default().registry.url.is_none());
}

#[test]
fn shared_dir_needs_a_shared_registry_and_an_absolute_path() {
    use crate::journal::log::LogPlace;
    use std::path::PathBuf;
    let tpl = "provider = \"template\"\n[template]\nadmin_dsn = \"postgresql://a@h/db\"\n";
    let url = "[registry]\nurl = \"postgresql://r@h/reg\"\n";
    let c: Config = toml::from_str(&format!("{tpl}{url}shared_dir = \"/mnt/fronts\"\n")).unwrap();
    c.validate().unwrap();
    assert_eq!(
        c.log_place(),
        LogPlace::Shared(PathBuf::from("/mnt/fronts"))
    );
    let c: Config = toml::from_str(&format!("{tpl}{url}shared_dir = \"fronts\"\n")).unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("registry.shared_dir") && e.contains("absolute"),
        "{e}"
    );
    let c: Config =
        toml::from_str(&format!("{tpl}[registry]\nshared_dir = \"/mnt/fronts\"\n")).unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("registry.shared_dir") && e.contains("registry.url"),
        "{e}"
    );
    // One gateway: logs and reviews in the data dir, as before.
    let c = Config::default();
    assert_eq!(c.log_place(), LogPlace::Local(c.data_dir.clone()));
}

#[test]
fn listeners_must_not_clash() {
    let c: Config =
        toml::from_str("listen = \"127.0.0.1:7000\"\napi_listen = \"127.0.0.1:7000\"").unwrap();
    assert!(c.validate().unwrap_err().to_string().contains("api_listen"));
    let c: Config =
        toml::from_str("listen = \"0.0.0.0:7000\"\napi_listen = \"127.0.0.1:7000\"").unwrap();
    assert!(c.validate().unwrap_err().to_string().contains("api_listen"));
    // Two kernel-chosen ports never clash; different ports or addresses are fine.
    let c: Config =
        toml::from_str("listen = \"127.0.0.1:0\"\napi_listen = \"127.0.0.1:0\"").unwrap();
    c.validate().unwrap();
    let c: Config =
        toml::from_str("listen = \"127.0.0.1:7000\"\napi_listen = \"127.0.0.2:7000\"").unwrap();
    c.validate().unwrap();
    Config::default().validate().unwrap();
}

#[test]
fn admin_key_is_absent_or_at_least_32_bytes() {
    let c: Config = toml::from_str("admin_key = \"\"").unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("admin_key") && e.contains("empty"), "{e}");
    let c: Config = toml::from_str("admin_key = \"hunter2\"").unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("admin_key") && e.contains("32 bytes"), "{e}");
    // The message never quotes the key itself.
    assert!(!e.contains("hunter2"), "{e}");
    let c: Config = toml::from_str(&format!("admin_key = \"{}\"", "k".repeat(32))).unwrap();
    c.validate().unwrap();
    assert!(check_admin_key("SANDPIT_ADMIN_KEY", "short")
        .unwrap_err()
        .to_string()
        .contains("SANDPIT_ADMIN_KEY"));
}

#[test]
fn durations_display_as_the_config_writes_them() {
    assert_eq!(display_duration(Duration::from_secs(24 * 3600)), "24h");
    assert_eq!(display_duration(Duration::from_secs(90 * 60)), "1h 30m");
    assert_eq!(display_duration(Duration::from_secs(45)), "45s");
    assert_eq!(display_duration(Duration::from_millis(1500)), "1s 500ms");
    assert_eq!(display_duration(Duration::ZERO), "0ms");
    let back = humantime::parse_duration(&display_duration(Duration::from_secs(3723))).unwrap();
    assert_eq!(back, Duration::from_secs(3723));
}

#[test]
fn preflight_checks_binaries_data_dir_files_and_env_key() {
    let tmp = tempfile::tempdir().unwrap();
    let with_dir = |d: &Path| Config {
        data_dir: d.to_path_buf(),
        ..Config::default()
    };
    // A data dir that does not exist yet is fine, and is not left behind.
    let fresh = tmp.path().join("a/b/data");
    with_dir(&fresh).preflight(None).unwrap();
    assert!(!tmp.path().join("a").exists());
    with_dir(tmp.path()).preflight(None).unwrap();
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "probe left behind"
    );
    // A file where the data dir (or a parent) should be.
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    for d in [file.clone(), file.join("data")] {
        let e = with_dir(&d).preflight(None).unwrap_err().to_string();
        assert!(e.contains("data_dir"), "{e}");
    }
    // Not writable even for root: sysfs refuses new directories, procfs new files.
    for d in ["/sys/sandpit-data", "/proc/self"] {
        let e = with_dir(Path::new(d))
            .preflight(None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("data_dir") && e.contains(d), "{e}");
    }
    // Postgres binaries: an explicit bin_dir must hold them.
    let mut c = with_dir(tmp.path());
    c.postgres.bin_dir = Some(tmp.path().join("no-such-bin"));
    let e = c.preflight(None).unwrap_err().to_string();
    assert!(e.contains("postgres.bin_dir"), "{e}");
    c.provider = "remote".into();
    c.preflight(None).unwrap();
    // The admin key from the environment, when the config has none.
    let c = with_dir(tmp.path());
    let e = c.preflight(Some("short")).unwrap_err().to_string();
    assert!(
        e.contains("SANDPIT_ADMIN_KEY") && !e.contains("short"),
        "{e}"
    );
    c.preflight(Some("")).unwrap();
    c.preflight(Some(&"k".repeat(40))).unwrap();
    // Files the config names must be there.
    let mut c = with_dir(tmp.path());
    c.template.ca_file = Some(tmp.path().join("missing-ca.pem"));
    let e = c.preflight(None).unwrap_err().to_string();
    assert!(e.contains("template.ca_file"), "{e}");
}

#[test]
fn pool_growth_settings_default_off_and_need_a_usable_half_life() {
    let c: Config = toml::from_str("[pool]\nsize = 2\n").unwrap();
    assert_eq!(
        (c.pool.max_size, c.pool.demand_half_life),
        (0, Duration::from_secs(60))
    );
    c.validate().unwrap();
    let c: Config =
        toml::from_str("[pool]\nsize = 2\nmax_size = 8\ndemand_half_life = \"10s\"\n").unwrap();
    assert_eq!(c.pool.max_size, 8);
    assert_eq!(c.pool.demand_half_life, Duration::from_secs(10));
    c.validate().unwrap();
    let c: Config =
        toml::from_str("[pool]\nsize = 2\nmax_size = 8\ndemand_half_life = \"0s\"\n").unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("pool.demand_half_life"), "{e}");
    // No ceiling above size: the half-life is never used, so any value passes.
    let c: Config = toml::from_str("[pool]\nsize = 2\ndemand_half_life = \"0s\"\n").unwrap();
    c.validate().unwrap();
}

#[test]
fn remote_takes_one_url_or_a_list_and_a_worker_needs_a_key() {
    // (remote section, valid)
    let table = [
        ("url = \"https://a/\"", true),
        ("urls = [\"https://a/\", \"http://b/\"]", true),
        ("url = \"https://a/\"\nurls = [\"https://b/\"]", false),
        ("urls = []", false),
        ("urls = [\"https://a/\", \"ftp://b/\"]", false),
    ];
    for (section, ok) in table {
        let c: Config = toml::from_str(&format!("provider = \"remote\"\n[remote]\n{section}"))
            .unwrap_or_else(|e| panic!("{section}: {e}"));
        assert_eq!(c.validate().is_ok(), ok, "{section}");
    }
    let c: Config =
        toml::from_str("[worker]\nlisten = \"127.0.0.1:0\"\napi_key = \"short\"").unwrap();
    assert!(c
        .worker
        .key()
        .unwrap_err()
        .to_string()
        .contains("worker.api_key"));
    let c: Config =
        toml::from_str("[worker]\nlisten = \"127.0.0.1:0\"\napi_key = \"a-key-of-enough-length\"")
            .unwrap();
    assert_eq!(c.worker.key().unwrap(), "a-key-of-enough-length");
    assert_eq!(c.worker.golden, "sandpit-golden");
}

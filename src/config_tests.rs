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
    let c: Config = toml::from_str("[tokens]\nttl = \"5m\"\nmax_rows = 10").unwrap();
    assert_eq!(c.tokens.ttl, Duration::from_secs(300));
    c.validate().unwrap();
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
    let e = toml::from_str::<Config>("[remote]\nurls = \"x\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("urls"), "{e}");
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
    let c: Config = toml::from_str(include_str!("../config/sandpit.toml")).unwrap();
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

//! Where a promotion goes: a DSN (admin key only), a target named under `[promote.targets]`,
//! or, when none is named, the source the token's golden was built from — its connection
//! parameters are stored with the golden without any secret, and the password comes from
//! `SANDPIT_PROMOTE_PASSWORD` in the gateway's environment — else the target named
//! `default`.

use super::{target, PromoteError, PromoteRequest, Who};
use crate::config::PromoteSection;
use crate::pgconn::BackendTarget;
use crate::provider::Provider;

/// Environment variable of the gateway holding the password for a golden's source.
pub const PASSWORD_ENV: &str = "SANDPIT_PROMOTE_PASSWORD";

/// A target ready to connect to.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// How to reach it (with its password, if any).
    pub target: BackendTarget,
    /// `postgresql://user@host:port/db`, never the password.
    pub shown: String,
    /// Role to apply the change as.
    pub role: Option<String>,
    /// Where it came from, for the page.
    pub origin: Origin,
}

/// Where a resolved target came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A DSN in the request.
    Dsn,
    /// A target named under `[promote.targets]`.
    Named(String),
    /// The source the token's golden was built from.
    GoldenSource,
}

impl Origin {
    /// As the page says it.
    pub fn words(&self) -> String {
        match self {
            Origin::Dsn => "the DSN given".into(),
            Origin::Named(n) => format!("[promote.targets.{n}]"),
            Origin::GoldenSource => "the source the golden was built from".into(),
        }
    }
}

/// The stored connection parameters (no secret) of golden `golden`'s source, if it was
/// built from a live database.
pub async fn golden_source(provider: &dyn Provider, golden: Option<&str>) -> Option<String> {
    let g = golden?;
    let all = provider.versions()?.goldens().await.ok()?;
    all.iter()
        .find(|v| v.id == g)
        .and_then(|v| v.report.get("source_conninfo"))
        .and_then(|s| s.as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The target of `req` for a token of golden `golden` (see the module doc for the order);
/// `kept` is the golden's source as kept with the token's captured change, which still
/// names it once the golden version itself is gone.
pub async fn resolve(
    cfg: &PromoteSection,
    provider: &dyn Provider,
    golden: Option<&str>,
    kept: Option<&str>,
    req: &PromoteRequest,
    who: &Who,
) -> Result<Resolved, PromoteError> {
    // Only looked up when it is needed: a named target or DSN does not list the goldens.
    let source = if req.dsn.is_none() && req.target.is_none() {
        golden_source(provider, golden)
            .await
            .or_else(|| kept.map(str::to_string))
    } else {
        None
    };
    let password = std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty());
    choose(cfg, source.as_deref(), golden, req, who, password)
}

/// [`resolve`] once the golden's source (if any) and the source password are known.
pub fn choose(
    cfg: &PromoteSection,
    source: Option<&str>,
    golden: Option<&str>,
    req: &PromoteRequest,
    who: &Who,
    source_password: Option<String>,
) -> Result<Resolved, PromoteError> {
    let parse = |dsn: &str| target::parse(dsn).map_err(|e| PromoteError::Invalid(e.to_string()));
    let named = |name: &str| -> Result<Resolved, PromoteError> {
        let t = cfg.targets.get(name).ok_or_else(|| {
            PromoteError::Invalid(format!(
                "no target named {name:?} under [promote.targets] (and no DSN given)"
            ))
        })?;
        let (target, shown) = parse(&t.dsn)?;
        Ok(Resolved {
            target,
            shown,
            role: t.role.clone(),
            origin: Origin::Named(name.to_string()),
        })
    };
    let mut r = match (&req.dsn, &req.target) {
        (Some(_), Some(_)) => {
            return Err(PromoteError::Invalid(
                "give a DSN or a target name, not both".into(),
            ))
        }
        (Some(d), None) => {
            if *who != Who::Admin {
                return Err(PromoteError::Forbidden(
                    "only the admin key may promote to a DSN; reviewers use a named target or the golden's source".into(),
                ));
            }
            let (target, shown) = parse(d)?;
            Resolved {
                target,
                shown,
                role: None,
                origin: Origin::Dsn,
            }
        }
        (None, Some(name)) => named(name)?,
        (None, None) => match source {
            Some(conninfo) => {
                let (mut target, shown) = parse(conninfo)?;
                target.password = source_password;
                Resolved {
                    target,
                    shown,
                    role: cfg.source_role.clone(),
                    origin: Origin::GoldenSource,
                }
            }
            None if cfg.targets.contains_key("default") => named("default")?,
            None => {
                return Err(PromoteError::Invalid(format!(
                    "no target named, and none by default: golden {} was not built from a live database, \
                     or its source is no longer known (the version is gone and no captured change \
                     kept it; its source would be the default), and [promote.targets] has no \"default\"; \
                     give a target DSN (--target, admin key only) or name a target of [promote.targets]",
                    golden.unwrap_or("(unknown)")
                )))
            }
        },
    };
    if req.role.is_some() {
        r.role = req.role.clone();
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PromoteTarget;

    const SOURCE: &str = "host='db.example' port='6000' user='app' dbname='shop' sslmode='disable'";

    fn cfg(default: bool) -> PromoteSection {
        let mut c = PromoteSection::default();
        if default {
            c.targets.insert(
                "default".into(),
                PromoteTarget {
                    dsn: "host=/tmp/s user=copy dbname=shop_copy".into(),
                    role: Some("writer".into()),
                },
            );
        }
        c.source_role = Some("owner".into());
        c
    }

    #[test]
    fn the_golden_source_comes_first_then_the_default_target() {
        let none = PromoteRequest::default();
        let r = choose(
            &cfg(true),
            Some(SOURCE),
            Some("v1"),
            &none,
            &Who::Admin,
            Some("pw".into()),
        )
        .unwrap();
        assert_eq!(r.origin, Origin::GoldenSource);
        assert_eq!(r.shown, "postgresql://app@db.example:6000/shop");
        assert_eq!(r.target.password.as_deref(), Some("pw"));
        assert_eq!(r.role.as_deref(), Some("owner"));
        let reviewer = Who::Reviewer("alice".into());
        let r = choose(&cfg(true), None, Some("base"), &none, &reviewer, None).unwrap();
        assert_eq!(r.origin, Origin::Named("default".into()));
        assert_eq!(r.role.as_deref(), Some("writer"));
        // A named target wins over the source; a role in the request over the configured.
        let req = PromoteRequest {
            target: Some("default".into()),
            role: Some("other".into()),
            ..Default::default()
        };
        let r = choose(
            &cfg(true),
            Some(SOURCE),
            Some("v1"),
            &req,
            &Who::Admin,
            None,
        )
        .unwrap();
        assert_eq!(r.origin, Origin::Named("default".into()));
        assert_eq!(r.role.as_deref(), Some("other"));
    }

    #[test]
    fn no_target_at_all_names_both_ways_and_dsns_stay_admin_only() {
        let none = PromoteRequest::default();
        let e = choose(&cfg(false), None, Some("base"), &none, &Who::Admin, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not built from a live database"), "{e}");
        assert!(
            e.contains("[promote.targets]") && e.contains("--target"),
            "{e}"
        );
        let dsn = PromoteRequest {
            dsn: Some("host=h user=u".into()),
            ..Default::default()
        };
        let e = choose(
            &cfg(true),
            None,
            None,
            &dsn,
            &Who::Reviewer("a".into()),
            None,
        );
        assert!(matches!(e, Err(PromoteError::Forbidden(_))));
    }
}

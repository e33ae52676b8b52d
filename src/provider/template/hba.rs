//! No direct login for task roles: at start the provider reads the shared server's
//! `pg_hba_file_rules` and refuses to run unless every rule that could let a task role in
//! (users `all`, any `+group`, a regular expression, an include, or a name shaped like ours)
//! either rejects, or is a unix-socket rule, or admits exactly the gateway's own address (as
//! the server sees the admin session: `inet_client_addr()`). Then a password the agent sets on
//! its own role opens nothing from anywhere else. `trust_network = true` skips the refusal
//! (the operator vouches that the server is unreachable from the agents' network).

use std::net::IpAddr;

use tokio_postgres::Client;

use super::{pg_err, TemplateProvider};
use crate::provider::ProviderError;

/// Group role every task role and seatbelt login is a member of, for `pg_hba.conf` rules
/// (`+sandpit_tasks`; membership counts there whatever INHERIT says). It holds no privilege.
pub const TASKS_GROUP: &str = "sandpit_tasks";

/// One row of `pg_hba_file_rules`, as far as the check needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct HbaRule {
    pub line: i32,
    /// `local`, `host`, `hostssl`, `hostnossl`, `hostgssenc`, `hostnogssenc`.
    pub kind: String,
    pub databases: Vec<String>,
    pub users: Vec<String>,
    pub address: Option<String>,
    pub netmask: Option<String>,
    pub method: Option<String>,
    pub error: Option<String>,
}

/// Whether a rule's user list could name a task role or seatbelt login.
fn may_match_tasks(users: &[String]) -> bool {
    users.iter().any(|u| {
        u == "all"
            || u.starts_with('+')
            || u.starts_with('/')
            || u.starts_with('@')
            || u.starts_with("sp_")
            || u.starts_with(super::POOL_PREFIX)
    })
}

/// Address families a rule with this address and mask covers entirely, as (v4, v6).
fn covers_all(address: Option<&str>, netmask: Option<&str>) -> (bool, bool) {
    match (address, netmask) {
        (Some("all"), _) => (true, true),
        (Some("0.0.0.0"), Some("0.0.0.0")) => (true, false),
        (Some("::"), Some("::")) => (false, true),
        _ => (false, false),
    }
}

/// Whether a rule admits exactly one address, the gateway's.
fn only_gateway(r: &HbaRule, gateway: Option<IpAddr>) -> bool {
    let Some(gw) = gateway else { return false };
    let Some(addr) = r.address.as_deref().and_then(|a| a.parse::<IpAddr>().ok()) else {
        return false;
    };
    let single = match r.netmask.as_deref() {
        Some("255.255.255.255") => addr.is_ipv4(),
        Some(m) => m
            .parse::<IpAddr>()
            .is_ok_and(|m| matches!(m, IpAddr::V6(v) if v.segments() == [0xffff; 8])),
        None => false,
    };
    single && addr == gw
}

/// The first reason the rules let a task role in from elsewhere than the gateway, if any
/// (rules read in order; a reject covering a whole address family for task roles shadows
/// later rules of that family).
pub fn judge(rules: &[HbaRule], gateway: Option<IpAddr>) -> Result<(), String> {
    let (mut v4_closed, mut v6_closed) = (false, false);
    for r in rules {
        if let Some(e) = &r.error {
            return Err(format!("pg_hba.conf line {}: {e}", r.line));
        }
        if !may_match_tasks(&r.users) || r.kind == "local" {
            continue;
        }
        let addr = r.address.as_deref().and_then(|a| a.parse::<IpAddr>().ok());
        // Shadowed by an earlier reject of the whole family.
        match addr {
            Some(IpAddr::V4(_)) if v4_closed => continue,
            Some(IpAddr::V6(_)) if v6_closed => continue,
            _ if v4_closed && v6_closed => break,
            _ => {}
        }
        if r.method.as_deref() == Some("reject") {
            let all_users = r
                .users
                .iter()
                .any(|u| u == "all" || u == &format!("+{TASKS_GROUP}"));
            if r.kind == "host" && all_users && r.databases.iter().any(|d| d == "all") {
                let (v4, v6) = covers_all(r.address.as_deref(), r.netmask.as_deref());
                v4_closed |= v4;
                v6_closed |= v6;
            }
            continue;
        }
        if !only_gateway(r, gateway) {
            return Err(format!(
                "pg_hba.conf line {} ({} {} {}/{}, {}) lets task roles log in from elsewhere than the gateway ({})",
                r.line,
                r.kind,
                r.users.join(","),
                r.address.as_deref().unwrap_or("?"),
                r.netmask.as_deref().unwrap_or("?"),
                r.method.as_deref().unwrap_or("?"),
                gateway.map_or("a unix socket".to_string(), |g| g.to_string()),
            ));
        }
    }
    Ok(())
}

impl TemplateProvider {
    /// Reads the server's rules and the gateway's address as the server sees it, and judges.
    pub(super) async fn check_hba(&self, c: &Client) -> Result<(), ProviderError> {
        let gateway: Option<IpAddr> = c
            .query_one("SELECT inet_client_addr()::text", &[])
            .await
            .map_err(|e| pg_err("reading the gateway's address", e))?
            .get::<_, Option<String>>(0)
            .and_then(|s| s.split('/').next().and_then(|a| a.parse().ok()));
        let rows = c
            .query(
                "SELECT line_number, type, database, user_name, address, netmask, auth_method, error \
                 FROM pg_hba_file_rules ORDER BY line_number",
                &[],
            )
            .await
            .map_err(|e| pg_err("reading pg_hba_file_rules (needs a superuser admin role, or set [template] trust_network = true)", e))?;
        let rules: Vec<HbaRule> = rows
            .iter()
            .map(|r| HbaRule {
                line: r.get(0),
                kind: r.get::<_, Option<String>>(1).unwrap_or_default(),
                databases: r.get::<_, Option<Vec<String>>>(2).unwrap_or_default(),
                users: r.get::<_, Option<Vec<String>>>(3).unwrap_or_default(),
                address: r.get(4),
                netmask: r.get(5),
                method: r.get(6),
                error: r.get(7),
            })
            .collect();
        judge(&rules, gateway).map_err(|why| {
            ProviderError::Template(format!(
                "{why}: task roles must reach the server only through the gateway (allow +{TASKS_GROUP} from the gateway's address only, reject it elsewhere), or set [template] trust_network = true if the network already keeps agents away"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(
        line: i32,
        kind: &str,
        users: &str,
        addr: Option<&str>,
        mask: Option<&str>,
        method: &str,
    ) -> HbaRule {
        HbaRule {
            line,
            kind: kind.into(),
            databases: vec!["all".into()],
            users: users.split(',').map(str::to_string).collect(),
            address: addr.map(str::to_string),
            netmask: mask.map(str::to_string),
            method: Some(method.into()),
            error: None,
        }
    }

    const ONE: Option<&str> = Some("255.255.255.255");
    const ZERO: Option<&str> = Some("0.0.0.0");

    #[test]
    fn only_the_gateway_s_address_or_a_socket_admits_task_roles() {
        let gw: Option<IpAddr> = "10.0.0.5".parse().ok();
        let local = rule(1, "local", "all", None, None, "trust");
        let gw_rule = rule(
            2,
            "hostssl",
            "+sandpit_tasks",
            Some("10.0.0.5"),
            ONE,
            "scram-sha-256",
        );
        let close4 = rule(3, "host", "+sandpit_tasks", Some("0.0.0.0"), ZERO, "reject");
        let close_all = rule(3, "host", "all", Some("all"), None, "reject");
        let open = rule(4, "hostssl", "all", Some("0.0.0.0"), ZERO, "scram-sha-256");
        let net = rule(
            4,
            "hostssl",
            "all",
            Some("10.0.0.0"),
            Some("255.0.0.0"),
            "scram-sha-256",
        );
        let admin_only = rule(
            5,
            "hostssl",
            "sp_admin_other,ops",
            Some("0.0.0.0"),
            ZERO,
            "scram-sha-256",
        );
        let ops = rule(5, "hostssl", "ops", Some("0.0.0.0"), ZERO, "scram-sha-256");
        let v6 = rule(6, "hostssl", "all", Some("::"), Some("::"), "scram-sha-256");
        let regex = rule(7, "host", "/^sp", Some("10.0.0.6"), ONE, "md5");
        let table: Vec<(&str, Vec<HbaRule>, Option<IpAddr>, bool)> = vec![
            (
                "socket and gateway only",
                vec![local.clone(), gw_rule.clone()],
                gw,
                true,
            ),
            (
                "open after a v4 close",
                vec![gw_rule.clone(), close4.clone(), open.clone()],
                gw,
                true,
            ),
            (
                "open v6 after a v4 close",
                vec![close4.clone(), v6.clone()],
                gw,
                false,
            ),
            (
                "anything after a full close",
                vec![close_all.clone(), v6, net.clone()],
                gw,
                true,
            ),
            ("a network, not one address", vec![net.clone()], gw, false),
            (
                "open before the close",
                vec![open.clone(), close4.clone()],
                gw,
                false,
            ),
            ("other users' rules", vec![ops, gw_rule.clone()], gw, true),
            ("a name shaped like ours", vec![admin_only], gw, false),
            ("a regular expression", vec![regex], gw, false),
            (
                "a socket gateway and a host rule",
                vec![gw_rule.clone()],
                None,
                false,
            ),
            (
                "another gateway",
                vec![gw_rule],
                "10.0.0.7".parse().ok(),
                false,
            ),
        ];
        for (what, rules, gw, ok) in table {
            assert_eq!(
                judge(&rules, gw).is_ok(),
                ok,
                "{what}: {:?}",
                judge(&rules, gw)
            );
        }
        let mut bad = local;
        bad.error = Some("invalid".into());
        assert!(judge(&[bad], gw).is_err(), "a rule with an error");
    }
}

//! The `template` seatbelt by Postgres privileges: beside the task role (which owns the
//! golden's objects and is the login of tokens allowed `ddl`), each scratch database gets a
//! read login (`<handle>_r`) and a write login (`<handle>_w`) that own nothing and create
//! nothing, so the server itself refuses what a token's policy forbids, whatever its SQL looks
//! like. Their table privileges are held by two server-wide group roles granted inside each
//! scratch database only (`pg_read_all_data` would reach the operator's other databases);
//! group names are the same in every fork, so a review's diff against the reference fork sees
//! no grant of its own. A login can connect only to its own database (CONNECT is granted per
//! role, never to the groups), so a group's grants in one database reach no other task.

use tokio_postgres::Client;

use super::hba::TASKS_GROUP;
// The logins' names, handed on: the rest of the provider knows them from the seatbelt.
pub(super) use super::logins::{handle_of, login_role, roles_of};
pub use super::logins::{read_role, write_role};
use super::records::RECORDS_TABLE;
use super::{pg_err, quote_ident, quote_literal, TemplateProvider};
use crate::provider::ProviderError;

/// Group role holding SELECT on every table and sequence of each scratch database.
pub const READ_GROUP: &str = "sandpit_tpl_read";
/// Group role holding SELECT, INSERT, UPDATE, DELETE on every table and USAGE, SELECT,
/// UPDATE on every sequence of each scratch database.
pub const WRITE_GROUP: &str = "sandpit_tpl_write";

/// Attributes of every login the provider makes. The seatbelt logins INHERIT (their only
/// membership is their group, whose grants are their privileges); the task role does not.
pub(super) const PLAIN: &str =
    "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS";

/// Schemas a fork's grants cover: every one but the system's.
const USER_SCHEMAS: &str = "SELECT nspname::text FROM pg_namespace \
     WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' ORDER BY 1";

impl TemplateProvider {
    /// Creates the two group roles (and the `pg_hba` group) once per server (across
    /// replicas), without login.
    pub(super) async fn ensure_groups(&self, c: &Client) -> Result<(), ProviderError> {
        for g in [READ_GROUP, WRITE_GROUP, TASKS_GROUP] {
            // `pg_advisory_xact_lock` against a replica's concurrent CREATE ROLE.
            c.batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('{g}')); \
                 DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{g}') THEN \
                   CREATE ROLE {g} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS; \
                 END IF; END $$; COMMIT"
            ))
            .await
            .map_err(|e| pg_err(&format!("creating role {g} (the admin role needs CREATEROLE)"), e))?;
            let row = c
                .query_one(
                    "SELECT rolcanlogin OR rolsuper OR rolcreatedb OR rolcreaterole \
                       OR rolreplication OR rolbypassrls \
                       OR EXISTS (SELECT 1 FROM pg_auth_members m WHERE m.member = r.oid) \
                     FROM pg_roles r WHERE rolname = $1",
                    &[&g],
                )
                .await
                .map_err(|e| pg_err("checking the seatbelt groups", e))?;
            if row.get::<_, bool>(0) {
                return Err(ProviderError::Template(format!(
                    "role {g} may log in, has special attributes or is a member of another role; \
                     the template seatbelt needs it plain (NOLOGIN, no memberships)"
                )));
            }
        }
        // Task roles made before the group: members now, so `+sandpit_tasks` rules admit the
        // gateway's logins of older forks too.
        c.batch_execute(&format!(
            "DO $$ DECLARE r text; BEGIN \
               FOR r IN SELECT b.handle FROM {RECORDS_TABLE} b JOIN pg_roles o ON o.rolname = b.handle \
                 WHERE NOT EXISTS (SELECT 1 FROM pg_auth_members m \
                   WHERE m.member = o.oid AND m.roleid = '{TASKS_GROUP}'::regrole) LOOP \
                 EXECUTE format('GRANT {TASKS_GROUP} TO %I', r); \
               END LOOP; END $$"
        ))
        .await
        .map_err(|e| pg_err("adding older task roles to the pg_hba group", e))?;
        Ok(())
    }

    /// Creates the read and write logins of `h`, recorded with their verifiers so the access
    /// checks cover them like the task role.
    pub(super) async fn create_seatbelt_roles(
        &self,
        c: &Client,
        h: &str,
    ) -> Result<(), ProviderError> {
        for (role, group) in [(read_role(h), READ_GROUP), (write_role(h), WRITE_GROUP)] {
            let verifier = self.rest_verifier(&role).await?;
            self.put_role_record(c, &role, &verifier).await?;
            let q = quote_ident(&role);
            c.batch_execute(&format!(
                "CREATE ROLE {q} {PLAIN} INHERIT PASSWORD {} VALID UNTIL '-infinity'; GRANT {group}, {} TO {q}",
                quote_literal(&verifier),
                TASKS_GROUP
            ))
            .await
            .map_err(|e| pg_err("creating a seatbelt role", e))?;
        }
        Ok(())
    }

    /// Inside the fork (`dc`, admin): CONNECT for the logins, and the groups' privileges on
    /// every user schema's tables and sequences. PUBLIC loses CREATE on the schemas and write
    /// privileges on tables and sequences a golden may have given it, as every role has
    /// PUBLIC's privileges (done in the reference fork too, so reviews see no change).
    pub(super) async fn grant_seatbelt(
        &self,
        c: &Client,
        dc: &Client,
        h: &str,
    ) -> Result<(), ProviderError> {
        c.batch_execute(&format!(
            "GRANT CONNECT ON DATABASE {} TO {}, {}",
            quote_ident(h),
            quote_ident(&read_role(h)),
            quote_ident(&write_role(h))
        ))
        .await
        .map_err(|e| pg_err("granting the seatbelt roles CONNECT", e))?;
        let schemas = dc
            .query(USER_SCHEMAS, &[])
            .await
            .map_err(|e| pg_err("listing schemas", e))?;
        let mut sql = String::new();
        for r in schemas {
            let s = quote_ident(&r.get::<_, String>(0));
            sql.push_str(&format!(
                "REVOKE CREATE ON SCHEMA {s} FROM PUBLIC; \
                 REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA {s} FROM PUBLIC; \
                 REVOKE USAGE, UPDATE ON ALL SEQUENCES IN SCHEMA {s} FROM PUBLIC; \
                 GRANT USAGE ON SCHEMA {s} TO {READ_GROUP}, {WRITE_GROUP}; \
                 GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {READ_GROUP}; \
                 GRANT SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {READ_GROUP}; \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {WRITE_GROUP}; \
                 GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {s} TO {WRITE_GROUP}; "
            ));
        }
        dc.batch_execute(&sql)
            .await
            .map_err(|e| pg_err("granting the seatbelt groups", e))
    }
}

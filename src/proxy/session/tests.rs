//! Table tests of the session's steps that need no connection.

use super::*;

/// A protocol 3.0 StartupMessage with `params`.
fn startup(params: &[(&str, &str)]) -> StartupMessage {
    StartupMessage {
        major: 3,
        minor: 0,
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect(),
    }
}

#[test]
fn the_backend_gets_the_clients_parameters_less_identity_and_the_tokens_timeouts_it_did_not_set() {
    let timeouts = [
        ("statement_timeout", "5000".to_string()),
        ("idle_in_transaction_session_timeout", "60000".to_string()),
    ];
    // (the client's parameters, what the backend is sent)
    for (sent, want) in [
        (
            vec![
                ("user", "sp_x"),
                ("database", "db"),
                ("application_name", "psql"),
            ],
            vec![
                ("application_name", "psql"),
                ("statement_timeout", "5000"),
                ("idle_in_transaction_session_timeout", "60000"),
            ],
        ),
        // Identity and protocol extensions are the gateway's; a timeout the client sets
        // as a startup parameter is its own (node-postgres' `statement_timeout`).
        (
            vec![
                ("replication", "false"),
                ("_pq_.x", "1"),
                ("Statement_Timeout", "3000"),
            ],
            vec![
                ("Statement_Timeout", "3000"),
                ("idle_in_transaction_session_timeout", "60000"),
            ],
        ),
        // A timeout set in the client's `options` is left to it, in any spelling the
        // server reads there.
        (
            vec![("options", "-c Statement_Timeout=0")],
            vec![
                ("options", "-c Statement_Timeout=0"),
                ("idle_in_transaction_session_timeout", "60000"),
            ],
        ),
        (
            vec![(
                "options",
                "--statement-timeout=0 -cidle-in-transaction-session-timeout=1",
            )],
            vec![(
                "options",
                "--statement-timeout=0 -cidle-in-transaction-session-timeout=1",
            )],
        ),
    ] {
        let s = startup(&sent);
        let got: Vec<(&str, &[u8])> = backend_params(&s, &timeouts);
        let want: Vec<(&str, &[u8])> = want.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        assert_eq!(got, want, "{sent:?}");
    }
}

#[test]
fn only_a_served_database_name_is_accepted() {
    let any = vec!["*".to_string()];
    let strict = vec!["sandpit".to_string()];
    let two = vec!["sandpit".to_string(), "shop".to_string()];
    let (u, db) = ("user", "database");
    // (configured names, the startup's parameters, accepted)
    type Row<'a> = (&'a [String], Vec<(&'a str, &'a str)>, bool);
    let table: [Row; 10] = [
        // The default: any name.
        (&any, vec![(u, "sp_x"), (db, "nosuchdb")], true),
        (&any, vec![(u, "sp_x"), (db, "postgres")], true),
        (&strict, vec![(u, "sp_x"), (db, "sandpit")], true),
        (&strict, vec![(u, "sp_x")], true),
        (&strict, vec![(u, "sp_x"), (db, "")], true),
        // libpq's default database is the user name.
        (&strict, vec![(u, "sp_x"), (db, "sp_x")], true),
        (&strict, vec![(u, "sp_x"), (db, "nosuchdb")], false),
        (&strict, vec![(u, "sp_x"), (db, "SANDPIT")], false),
        (&strict, vec![(u, "sp_x"), (db, "postgres")], false),
        (&two, vec![(u, "sp_x"), (db, "shop")], true),
    ];
    for (names, params, ok) in table {
        let r = database_served(names, &startup(&params));
        assert_eq!(r.is_ok(), ok, "{names:?} {params:?}");
        if let Err(e) = r {
            assert_eq!(e.sqlstate(), "3D000");
            assert!(e.to_string().contains("does not exist"), "{e}");
        }
    }
}

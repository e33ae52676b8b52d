//! Table tests of the session's steps that need no connection.

use super::*;

#[test]
fn the_backend_gets_the_clients_parameters_less_identity_and_the_tokens_timeouts() {
    let startup = |params: &[(&str, &str)]| StartupMessage {
        major: 3,
        minor: 0,
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect(),
    };
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
        // Identity and protocol extensions are the gateway's; the client's own timeout
        // parameters give way to the token's.
        (
            vec![
                ("replication", "false"),
                ("_pq_.x", "1"),
                ("Statement_Timeout", "0"),
            ],
            vec![
                ("statement_timeout", "5000"),
                ("idle_in_transaction_session_timeout", "60000"),
            ],
        ),
        // A timeout set in the client's `options` is left to it.
        (
            vec![("options", "-c Statement_Timeout=0")],
            vec![
                ("options", "-c Statement_Timeout=0"),
                ("idle_in_transaction_session_timeout", "60000"),
            ],
        ),
    ] {
        let s = startup(&sent);
        let got: Vec<(&str, &[u8])> = backend_params(&s, &timeouts);
        let want: Vec<(&str, &[u8])> = want.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        assert_eq!(got, want, "{sent:?}");
    }
}

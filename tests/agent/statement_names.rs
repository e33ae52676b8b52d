//! The statement log cannot be made to lie about what ran (issue 29): raw protocol over real
//! sockets to a real gateway. The server forgets statement names (`DISCARD ALL`,
//! `DEALLOCATE [ALL]`) and SQL `PREPARE` shares their namespace; whatever a client does with
//! them, an Execute that ran an UPDATE is logged with the UPDATE's text and kind `write`, and
//! the number of UPDATEs the log shows is the number the table saw. Kinds follow the
//! server's command tags, whatever the splitter made of the text. And what drivers do by
//! SQL with names they made through the protocol (`DEALLOCATE`, `FETCH`, `MOVE`, `CLOSE`)
//! reaches what the server holds for them.

use crate::support::harness;
use crate::support::wire;

use std::sync::OnceLock;

use crate::support::harness::Gateway;
use serde_json::Value;
use wire::{bind, execute, field, first_column, parse, query, sync, Msg, Raw};

const GOLDEN: &str = "create table t(id int primary key, a int not null);\n\
insert into t select g, 0 from generate_series(1, 10) g;\n";

fn gw() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| harness::process_gateway(|| Gateway::start(Some(GOLDEN), None)))
}

/// A token and its whole secret (`<id>.<secret>`).
fn token(task: &str) -> (String, String) {
    let v = gw().issue(task, 600);
    let d = v["dsn"].as_str().expect("dsn");
    let creds = d
        .split("://")
        .nth(1)
        .and_then(|s| s.split('@').next())
        .expect("creds");
    (
        v["id"].as_str().expect("id").to_string(),
        creds.replacen(':', ".", 1),
    )
}

fn statements(id: &str) -> Vec<Value> {
    let (s, v) = gw().raw_call("GET", &format!("/v1/tokens/{id}/statements"), None);
    assert_eq!(s, 200, "{v}");
    v.as_array().cloned().unwrap_or_default()
}

/// Sends `msgs` in one write and reads `readies` ReadyForQuerys' worth of answers.
fn flight(raw: &mut Raw, msgs: &[Vec<u8>], readies: usize) -> Vec<Msg> {
    raw.send(&msgs.concat());
    (0..readies).flat_map(|_| raw.until_ready()).collect()
}

/// Sends each group (up to its Sync or Query) after the previous one was answered.
fn stepwise(raw: &mut Raw, groups: &[Vec<Vec<u8>>]) -> Vec<Msg> {
    groups.iter().flat_map(|g| flight(raw, g, 1)).collect()
}

fn tags(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter(|(t, _)| *t == b'C')
        .map(|(_, b)| String::from_utf8_lossy(&b[..b.len() - 1]).into_owned())
        .collect()
}

fn codes(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter(|(t, _)| *t == b'E')
        .map(|(_, b)| field(b, b'C'))
        .collect()
}

/// `t.a` of row `id`, read on its own session.
fn counter(secret: &str, id: i32) -> i64 {
    let mut raw = Raw::login(gw().pg_port, secret);
    let msgs = flight(
        &mut raw,
        &[query(&format!("select a from t where id = {id}"))],
        1,
    );
    let row = msgs.iter().find(|(t, _)| *t == b'D').expect("row");
    first_column(&row.1).expect("value").parse().expect("int")
}

/// Every outcome tagged UPDATE is logged as a write with one of `updates`' texts (or a SQL
/// `EXECUTE`, which runs the UPDATE of row `executed`), the harmless text never carries an
/// UPDATE's tag, and the log shows as many UPDATEs of each row as the row saw.
fn check_log(id: &str, secret: &str, updates: &[(i32, String)], executed: i32) {
    let log = statements(id);
    let mut seen = std::collections::BTreeMap::<i32, i64>::new();
    for s in &log {
        let text = s["text"].as_str().unwrap_or("");
        let tag = s["outcome"]["tag"].as_str().unwrap_or("");
        if tag.starts_with("UPDATE") {
            assert_eq!(s["kind"], "write", "{s}");
            assert_eq!(s["kind_source"], "server", "{s}");
            let row = match updates.iter().find(|(_, u)| u == text) {
                Some((row, _)) => *row,
                None if text.starts_with("EXECUTE") => executed,
                None => panic!("an UPDATE logged as {s}"),
            };
            *seen.entry(row).or_default() += 1;
        }
        if text.contains("harmless") {
            assert!(!tag.starts_with("UPDATE"), "{s}");
        }
    }
    for (row, _) in updates {
        assert_eq!(
            seen.get(row).copied().unwrap_or(0),
            counter(secret, *row),
            "UPDATEs of row {row} in the log vs the row: {log:#?}"
        );
    }
}

/// How a scenario's messages travel.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Each Sync group after the previous one's answer.
    Stepwise,
    /// Everything in one write, before any answer.
    OneFlight,
}

/// Parse `s8` harmless; `forget` (a simple Query); Parse `s8` = the UPDATE; Bind/Execute
/// `s8`. Returns the answers.
fn forget_and_reparse(raw: &mut Raw, forget: &str, update: &str, mode: Mode) -> Vec<Msg> {
    let groups = vec![
        vec![parse("s8", "SELECT 'harmless'"), sync()],
        vec![query(forget)],
        vec![parse("s8", update), sync()],
        vec![bind("", "s8"), execute("", 0), sync()],
    ];
    match mode {
        Mode::Stepwise => stepwise(raw, &groups),
        Mode::OneFlight => flight(raw, &groups.concat(), 4),
    }
}

#[test]
fn a_forgotten_name_parsed_again_is_logged_with_the_text_that_ran() {
    let (id, secret) = token("names-forget");
    let mut row = 0;
    let forgets = [
        "DISCARD ALL",
        "DEALLOCATE ALL",
        "DEALLOCATE s8",
        "deallocate prepare \"s8\" ;",
        "Deallocate S8",
    ];
    for forget in forgets {
        for mode in [Mode::Stepwise, Mode::OneFlight] {
            row += 1;
            let update = format!("UPDATE t SET a = a + 1 WHERE id = {row}");
            let mut raw = Raw::login(gw().pg_port, &secret);
            let msgs = forget_and_reparse(&mut raw, forget, &update, mode);
            let ran = tags(&msgs).iter().any(|t| t == "UPDATE 1");
            // The server forgot the statement (`DEALLOCATE s8` reaches the one it holds for
            // the client's `s8`, waiting for its Parse's answer in one flight): the second
            // Parse is accepted and the Execute runs the UPDATE.
            assert!(
                ran,
                "{forget} {mode:?}: {:?} {:?}",
                tags(&msgs),
                codes(&msgs)
            );
            assert!(
                codes(&msgs).is_empty(),
                "{forget} {mode:?}: {:?}",
                codes(&msgs)
            );
        }
    }
    let updates: Vec<(i32, String)> = (1..=row)
        .map(|row| (row, format!("UPDATE t SET a = a + 1 WHERE id = {row}")))
        .collect();
    check_log(&id, &secret, &updates, 0);
}

#[test]
fn deallocate_inside_one_sync_group_is_followed_too() {
    // The forgetting statement runs through the extended protocol, in the same Sync group
    // as the second Parse and the Execute: nothing is answered before all of it was sent.
    let (id, secret) = token("names-group");
    let update = "UPDATE t SET a = a + 1 WHERE id = 7";
    let mut raw = Raw::login(gw().pg_port, &secret);
    let msgs = flight(
        &mut raw,
        &[
            parse("s8", "SELECT 'harmless'"),
            sync(),
            parse("", "DEALLOCATE ALL"),
            bind("", ""),
            execute("", 0),
            parse("s8", update),
            bind("", "s8"),
            execute("", 0),
            sync(),
        ],
        2,
    );
    assert!(codes(&msgs).is_empty(), "{:?}", codes(&msgs));
    assert_eq!(tags(&msgs), ["DEALLOCATE ALL", "UPDATE 1"]);
    check_log(&id, &secret, &[(7, update.to_string())], 0);
}

#[test]
fn sql_prepare_and_protocol_parse_of_one_name_stay_apart() {
    let (id, secret) = token("names-sql");
    let update = "UPDATE t SET a = a + 1 WHERE id = 8";
    // A protocol Parse first, then SQL PREPARE of the same name (a server would refuse the
    // PREPARE; behind the gateway the two live apart): the protocol Bind reaches the Parse's
    // statement, and so does SQL `EXECUTE` of the name (SQL naming a name the client made
    // through the protocol means that one, as `DEALLOCATE` does): the UPDATE never runs.
    let mut raw = Raw::login(gw().pg_port, &secret);
    let msgs = stepwise(
        &mut raw,
        &[
            vec![parse("s8", "SELECT 'harmless'"), sync()],
            vec![query(&format!("PREPARE s8 AS {update}"))],
            vec![bind("", "s8"), execute("", 0), sync()],
            vec![query("EXECUTE s8")],
        ],
    );
    assert!(codes(&msgs).is_empty(), "{:?}", codes(&msgs));
    assert_eq!(tags(&msgs), ["PREPARE", "SELECT 1", "SELECT 1"]);
    // The reverse, in one flight: SQL PREPARE first, then a protocol Parse of the name.
    let mut raw = Raw::login(gw().pg_port, &secret);
    let msgs = flight(
        &mut raw,
        &[
            query(&format!("PREPARE s9 AS {update}")),
            parse("s9", "SELECT 'harmless'"),
            bind("", "s9"),
            execute("", 0),
            sync(),
            query("EXECUTE s9"),
        ],
        3,
    );
    assert!(codes(&msgs).is_empty(), "{:?}", codes(&msgs));
    assert_eq!(tags(&msgs), ["PREPARE", "SELECT 1", "SELECT 1"]);
    // A name only SQL prepared: a protocol Bind of it does not reach that statement.
    for mode in [Mode::Stepwise, Mode::OneFlight] {
        let mut raw = Raw::login(gw().pg_port, &secret);
        let groups = vec![
            vec![query(&format!("PREPARE s10 AS {update}"))],
            vec![bind("", "s10"), execute("", 0), sync()],
        ];
        let msgs = match mode {
            Mode::Stepwise => stepwise(&mut raw, &groups),
            Mode::OneFlight => flight(&mut raw, &groups.concat(), 2),
        };
        assert_eq!(codes(&msgs), ["26000"], "{mode:?}");
        assert_eq!(tags(&msgs), ["PREPARE"], "{mode:?}");
    }
    // SQL DEALLOCATE of a name only SQL prepared frees that one, as the client said.
    let mut raw = Raw::login(gw().pg_port, &secret);
    let msgs = stepwise(
        &mut raw,
        &[
            vec![query("PREPARE s11 AS SELECT 'harmless'")],
            vec![query("DEALLOCATE s11")],
            vec![query("EXECUTE s11")],
        ],
    );
    assert_eq!(tags(&msgs), ["PREPARE", "DEALLOCATE"]);
    assert_eq!(codes(&msgs), ["26000"]);
    check_log(&id, &secret, &[(8, update.to_string())], 8);
}

#[test]
fn kinds_follow_the_servers_tags() {
    let (id, secret) = token("names-kinds");
    let mut raw = Raw::login(gw().pg_port, &secret);
    flight(
        &mut raw,
        &[
            query("SELECT 'BEGIN ATOMIC'; DELETE FROM t WHERE id = 10"),
            query("SELECT 1; UPDATE t SET a = a WHERE id = 9; CREATE TABLE k(x int); BEGIN; COMMIT; GRANT SELECT ON k TO PUBLIC"),
            query("SELECT $$; DELETE FROM t WHERE id = 9; $$"),
            query("PREPARE d AS DELETE FROM t WHERE id = 8"),
            query("EXECUTE d"),
        ],
        5,
    );
    // The lexer's guess for `EXECUTE d` (stored in the statement record) is not a write; the
    // server's tag says it is one, and that is what readers give.
    let file = gw()
        .data_dir
        .join("logs")
        .join("names-kinds")
        .join(format!("{id}.jsonl"));
    let mut stored = None;
    sandpit::journal::log::scan(&file, |e| {
        if let sandpit::journal::log::LogEntry::Statement { statement, .. } = e {
            if statement.text == "EXECUTE d" {
                stored = Some(serde_json::to_value(&statement).expect("json"));
            }
        }
    })
    .expect("log file");
    let stored = stored.expect("EXECUTE d logged");
    assert_ne!(stored["kind"], "write", "{stored}");
    let execute = statements(&id)
        .into_iter()
        .find(|s| s["text"] == "EXECUTE d")
        .expect("EXECUTE d read back");
    assert_eq!(execute["outcome"]["tag"], "DELETE 1", "{execute}");
    assert_eq!(execute["kind"], "write", "{execute}");
    assert_eq!(execute["kind_source"], "server", "{execute}");
    let log = statements(&id);
    let mut checked = 0;
    for s in &log {
        let Some(tag) = s["outcome"]["tag"].as_str() else {
            continue;
        };
        let want = match tag.split(' ').next().unwrap_or("") {
            "DELETE" | "UPDATE" => "write",
            "CREATE" => "ddl",
            "BEGIN" | "COMMIT" => "transaction",
            "GRANT" => "privilege",
            "PREPARE" => "utility",
            "SELECT" => {
                // A text that brought a SELECT and a DELETE result is as strong as the DELETE.
                if s["text"]
                    .as_str()
                    .unwrap_or("")
                    .contains("DELETE FROM t WHERE id = 10")
                {
                    "write"
                } else {
                    "read"
                }
            }
            other => panic!("unexpected tag {other}: {s}"),
        };
        assert_eq!(s["kind"], want, "{s}");
        assert_eq!(s["kind_source"], "server", "{s}");
        checked += 1;
    }
    // Every statement of the three texts completed (however the splitter cut them).
    assert!(checked >= 3, "{log:#?}");
    // The review counts kinds the same way (its "writes" follow the tags).
    let (st, review) = gw().raw_call("GET", &format!("/v1/tokens/{id}/diff"), None);
    assert_eq!(st, 200, "{review}");
    let log = statements(&id);
    for kind in ["read", "write", "ddl", "transaction", "privilege"] {
        let n = log.iter().filter(|s| s["kind"] == kind).count() as u64;
        let counted = review["statements"]["by_kind"][kind].as_u64().unwrap_or(0);
        assert_eq!(counted, n, "{kind}: {review} vs {log:#?}");
    }
    assert!(
        review["statements"]["by_kind"]["write"].as_u64() >= Some(2),
        "{review}"
    );
    assert!(
        log.iter().any(|s| s["outcome"]["tag"]
            .as_str()
            .is_some_and(|t| t.starts_with("DELETE"))
            || s["text"]
                .as_str()
                .unwrap_or("")
                .contains("DELETE FROM t WHERE id = 10")
                && s["kind"] == "write"),
        "{log:#?}"
    );
}

/// The first column of every DataRow.
fn column(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter(|(t, _)| *t == b'D')
        .filter_map(|(_, b)| first_column(b))
        .collect()
}

#[test]
fn sql_fetch_move_and_close_reach_a_protocol_portal() {
    // asyncpg's `Cursor.forward` sends `MOVE FORWARD n <portal>` for a portal it bound
    // through the protocol: the server knows that portal by the gateway's name.
    let (_id, secret) = token("names-portal-sql");
    for mode in [Mode::Stepwise, Mode::OneFlight] {
        let mut raw = Raw::login(gw().pg_port, &secret);
        let groups = vec![
            vec![query("BEGIN")],
            vec![
                parse("s1", "SELECT g FROM generate_series(1, 10) g"),
                bind("c1", "s1"),
                execute("c1", 2),
                sync(),
            ],
            vec![query("MOVE FORWARD 3 c1")],
            vec![query("fetch 2 from \"c1\";")],
            vec![query("CLOSE C1")],
            vec![execute("c1", 0), sync()],
            vec![query("ROLLBACK")],
        ];
        let msgs = match mode {
            Mode::Stepwise => stepwise(&mut raw, &groups),
            Mode::OneFlight => flight(&mut raw, &groups.concat(), groups.len()),
        };
        assert_eq!(
            tags(&msgs),
            ["BEGIN", "MOVE 3", "FETCH 2", "CLOSE CURSOR", "ROLLBACK"],
            "{mode:?}: {:?}",
            codes(&msgs)
        );
        // Rows 1-2 from the Execute, 3-5 moved past, 6-7 fetched by SQL.
        assert_eq!(column(&msgs), ["1", "2", "6", "7"], "{mode:?}");
        // Closed by SQL, the portal is gone on the server: the server says so.
        assert_eq!(codes(&msgs), ["34000"], "{mode:?}");
    }
}

#[test]
fn a_changed_result_type_reaches_the_client_with_the_servers_routine() {
    // asyncpg re-prepares a statement whose result type changed, telling that error by its
    // routine field (the message is localized): the gateway relays the source fields.
    let (_id, secret) = token("names-revalidate");
    let mut raw = Raw::login(gw().pg_port, &secret);
    let msgs = stepwise(
        &mut raw,
        &[
            vec![parse("s2", "SELECT * FROM t WHERE id = 1"), sync()],
            vec![query("ALTER TABLE t ADD COLUMN b int")],
            vec![bind("", "s2"), execute("", 0), sync()],
        ],
    );
    let err = msgs
        .iter()
        .find(|(t, _)| *t == b'E')
        .map(|(_, b)| b.clone())
        .expect("an error");
    assert_eq!(field(&err, b'C'), "0A000");
    assert_eq!(field(&err, b'R'), "RevalidateCachedQuery");
    assert_eq!(field(&err, b'F'), "plancache.c");
    assert!(!field(&err, b'L').is_empty());
}

#[test]
fn sql_execute_runs_a_protocol_statement() {
    // asyncpg's `prepare(name=...)` then SQL `EXECUTE name`: the server holds the statement
    // under the gateway's name. Arguments and a trailing `;` stay as sent; in a Query or in
    // a Parse alike.
    let (_id, secret) = token("names-execute-sql");
    for mode in [Mode::Stepwise, Mode::OneFlight] {
        let mut raw = Raw::login(gw().pg_port, &secret);
        let groups = vec![
            vec![parse("s3", "SELECT $1::int + 1"), sync()],
            vec![query("EXECUTE s3 (41);")],
            vec![query("execute \"s3\"('1')")],
            // Inside a Parse (asyncpg's `fetchval('EXECUTE name')`), unnamed and named.
            vec![
                parse("", "EXECUTE s3(5)"),
                bind("", ""),
                execute("", 0),
                sync(),
            ],
            vec![
                parse("e1", "execute s3 (6)"),
                bind("", "e1"),
                execute("", 0),
                sync(),
            ],
            vec![query("DEALLOCATE s3")],
            vec![query("EXECUTE s3(1)")],
        ];
        let msgs = match mode {
            Mode::Stepwise => stepwise(&mut raw, &groups),
            Mode::OneFlight => flight(&mut raw, &groups.concat(), groups.len()),
        };
        assert_eq!(
            column(&msgs),
            ["42", "2", "6", "7"],
            "{mode:?}: {:?}",
            codes(&msgs)
        );
        // Freed, the statement is gone on the server: the server says so.
        assert_eq!(codes(&msgs), ["26000"], "{mode:?}");
    }
}

#[test]
fn an_execute_inside_explain_or_create_table_as_reaches_a_protocol_statement() {
    // sqlx learns a statement's nullable columns with `EXPLAIN (VERBOSE, FORMAT JSON)
    // EXECUTE sqlx_s_1(NULL)`, in a Query; `CREATE TABLE … AS EXECUTE` and a comment before
    // the command, or several statements in one Query, reach it too. A string that only
    // mentions it does not.
    let (_id, secret) = token("names-execute-inside");
    for mode in [Mode::Stepwise, Mode::OneFlight] {
        let mut raw = Raw::login(gw().pg_port, &secret);
        let table = format!("t_{}", matches!(mode, Mode::Stepwise) as u8);
        let groups = vec![
            vec![parse("sqlx_s_1", "SELECT $1::int + 1 AS n"), sync()],
            vec![query(
                "EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE sqlx_s_1(NULL)",
            )],
            vec![query(&format!(
                "/* c */ CREATE TEMP TABLE {table} AS EXECUTE sqlx_s_1(9)"
            ))],
            vec![query(&format!(
                "SELECT n FROM {table}; EXECUTE sqlx_s_1(20)"
            ))],
            vec![query("SELECT 'EXECUTE sqlx_s_1(1)'")],
            vec![
                parse("", "EXPLAIN EXECUTE sqlx_s_1(2)"),
                bind("", ""),
                execute("", 0),
                sync(),
            ],
        ];
        let msgs = match mode {
            Mode::Stepwise => stepwise(&mut raw, &groups),
            Mode::OneFlight => flight(&mut raw, &groups.concat(), groups.len()),
        };
        assert_eq!(codes(&msgs), Vec::<String>::new(), "{mode:?}");
        let col = column(&msgs);
        assert!(col[0].contains("\"Output\""), "{mode:?}: {col:?}");
        assert_eq!(&col[1..4], ["10", "21", "EXECUTE sqlx_s_1(1)"], "{mode:?}");
        assert!(col[4].starts_with("Result"), "{mode:?}: {col:?}");
    }
}

/// The text of every ErrorResponse's message field.
fn messages(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter(|(t, _)| *t == b'E')
        .map(|(_, b)| field(b, b'M'))
        .collect()
}

#[test]
fn errors_name_the_clients_statements_and_portals_not_the_gateways() {
    // asyncpg matches `prepared statement "foobar" already exists`; a server would name the
    // client's own name, and so does the gateway, whatever name the backend holds.
    let (_id, secret) = token("names-in-errors");
    let mut raw = Raw::login(gw().pg_port, &secret);
    let msgs = stepwise(
        &mut raw,
        &[
            vec![parse("foobar", "SELECT 1"), sync()],
            vec![parse("foobar", "SELECT 2"), sync()],
            vec![bind("", "nope"), execute("", 0), sync()],
            vec![execute("nop", 0), sync()],
            vec![query("BEGIN")],
            vec![bind("c2", "foobar"), sync()],
            vec![query("CLOSE c2")],
            vec![execute("c2", 0), sync()],
        ],
    );
    assert_eq!(
        messages(&msgs),
        [
            "prepared statement \"foobar\" already exists",
            "prepared statement \"nope\" does not exist",
            "portal \"nop\" does not exist",
            "portal \"c2\" does not exist",
        ]
    );
}

#[test]
fn an_error_full_of_backend_names_stays_bounded() {
    // Hostile: the agent reads its statement's backend name from pg_prepared_statements and
    // makes the server quote it thousands of times in one error. Each is shown as the
    // client's 128-byte name only until the field reaches the error-field bound, which the
    // relayed error then keeps; a longer client name is never shown in its place.
    let (_id, secret) = token("names-error-flood");
    let shown = "n".repeat(128);
    let hidden = "h".repeat(129);
    let mut raw = Raw::login(gw().pg_port, &secret);
    let msgs = stepwise(
        &mut raw,
        &[
            vec![
                parse(&shown, "SELECT 1"),
                parse(&hidden, "SELECT 2"),
                sync(),
            ],
            vec![query(
                "SELECT name FROM pg_prepared_statements ORDER BY statement",
            )],
        ],
    );
    let backend = column(&msgs);
    assert_eq!(backend.len(), 2, "{msgs:?}");
    let flood = format!("{} ", backend[0]).repeat(2000);
    let msgs = stepwise(&mut raw, &[vec![query(&format!("SELECT '{flood}'::int"))]]);
    let m = messages(&msgs).pop().expect("an error");
    assert!(
        m.starts_with(&format!(
            "invalid input syntax for type integer: \"{shown} {shown}"
        )),
        "{}",
        &m[..200]
    );
    assert!(m.len() < 4096 + 64, "{} bytes", m.len());
    assert!(m.contains("more bytes cut]"), "cut at the bound");
    let msgs = stepwise(
        &mut raw,
        &[vec![query(&format!("SELECT '{}'::int", backend[1]))]],
    );
    let m = messages(&msgs).pop().expect("an error");
    assert!(m.contains(&backend[1]) && !m.contains(&hidden), "{m}");
}

#[test]
fn sql_fetch_cannot_run_a_write_bound_through_the_protocol() {
    // Hostile: bind an UPDATE ... RETURNING to a portal without executing it, then run it by
    // SQL FETCH, whose record and `FETCH n` tag would read as a fetch. The gateway reaches
    // only portals of reads by SQL FETCH/MOVE: this one stays unknown to the server, so
    // nothing runs; the row is read back to prove it.
    let (id, secret) = token("names-fetch-write");
    let update = "UPDATE t SET a = a + 1 WHERE id = 9 RETURNING a";
    for mode in [Mode::Stepwise, Mode::OneFlight] {
        let mut raw = Raw::login(gw().pg_port, &secret);
        let groups = vec![
            vec![query("BEGIN")],
            vec![parse("w1", update), bind("c9", "w1"), sync()],
            vec![query("FETCH ALL FROM c9")],
            vec![query("COMMIT")],
        ];
        let msgs = match mode {
            Mode::Stepwise => stepwise(&mut raw, &groups),
            Mode::OneFlight => flight(&mut raw, &groups.concat(), groups.len()),
        };
        assert_eq!(codes(&msgs), ["34000"], "{mode:?}: {:?}", tags(&msgs));
        assert!(
            !tags(&msgs).iter().any(|t| t.starts_with("FETCH")),
            "{mode:?}"
        );
    }
    assert_eq!(counter(&secret, 9), 0, "the UPDATE never ran");
    check_log(&id, &secret, &[(9, update.to_string())], 9);
}

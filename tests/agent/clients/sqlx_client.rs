//! The client scenario with sqlx (Postgres driver, runtime queries, rustls), through the gateway.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use sqlx::postgres::{PgConnection, PgListener};
use sqlx::{Connection, Executor, Row};

use super::matrix::{want, Ctx, StepResult, Steps};
use super::Target;

/// Steps sqlx has no API for; the matrix says so instead of faking them.
pub const SKIPS: &[&str] = &["channel_binding", "cancel"];

async fn connect(dsn: &str) -> Result<PgConnection, String> {
    PgConnection::connect(dsn).await.ctx("connect")
}

pub async fn scenario(t: Target, caps: bool) -> String {
    let mut s = Steps::new(&super::matrix::locked_version("sqlx"));
    s.record("connect_scram", connect_scram(&t).await);
    s.record("connect_tls_cleartext", connect_tls_cleartext(&t).await);
    s.skip(
        "channel_binding",
        "sqlx does not implement SCRAM-SHA-256-PLUS (it sends n,, and plain SCRAM works over TLS)",
    );
    let mut c = match connect(&t.dsn).await {
        Ok(c) => c,
        Err(e) => {
            s.record("scenario", Err(e));
            return s.finish();
        }
    };
    s.record("create_table", create_table(&mut c).await);
    s.record("insert_params", insert_params(&mut c).await);
    s.record("prepared_reuse", prepared_reuse(&mut c).await);
    s.record("transaction_rollback", transaction_rollback(&mut c).await);
    s.record("savepoint", savepoint(&mut c).await);
    s.record("copy_in", copy_in(&mut c).await);
    s.record("copy_out", copy_out(&mut c).await);
    s.record("listen_notify", listen_notify(&t).await);
    s.skip("cancel", "sqlx has no query-cancel API");
    s.record("unique_violation", unique_violation(&mut c).await);
    s.record("types_roundtrip", types_roundtrip(&mut c).await);
    s.record("cursor", cursor(&mut c).await);
    match two_phase(&mut c).await {
        Ok(Some(d)) => s.record("two_phase", Ok(d)),
        Ok(None) => s.skip("two_phase", "max_prepared_transactions is 0 on this server"),
        Err(e) => s.record("two_phase", Err(e)),
    }
    s.record("terminate_self", terminate_self(&t).await);
    if caps {
        s.record("capped_select", capped_select(&t).await);
    } else {
        s.skip("capped_select", "SANDPIT_CAPS is not 1");
    }
    s.finish()
}

/// `None`: the server has no prepared transactions (max_prepared_transactions = 0).
async fn two_phase(c: &mut PgConnection) -> Result<Option<String>, String> {
    let mpt: String = sqlx::query_scalar("show max_prepared_transactions")
        .fetch_one(&mut *c)
        .await
        .ctx("show")?;
    if mpt == "0" {
        return Ok(None);
    }
    sqlx::raw_sql(
        "create table tpc_sqlx(id int); begin; insert into tpc_sqlx values (1); \
         prepare transaction 'sandpit-sqlx'",
    )
    .execute(&mut *c)
    .await
    .ctx("prepare transaction")?;
    // A query of its own: COMMIT PREPARED refuses to run inside a multi-statement query.
    sqlx::raw_sql("commit prepared 'sandpit-sqlx'")
        .execute(&mut *c)
        .await
        .ctx("commit prepared")?;
    let n: i64 = sqlx::query_scalar("select count(*) from tpc_sqlx")
        .fetch_one(&mut *c)
        .await
        .ctx("count")?;
    want("committed rows", n, 1)?;
    Ok(Some(format!(
        "PREPARE TRANSACTION / COMMIT PREPARED (max_prepared_transactions = {mpt})"
    )))
}

async fn terminate_self(t: &Target) -> StepResult {
    let mut c = connect(&t.dsn).await?;
    let e = match sqlx::query("select pg_terminate_backend(pg_backend_pid())")
        .execute(&mut c)
        .await
    {
        Ok(_) => return Err("no error".into()),
        Err(e) => e,
    };
    let db = e
        .as_database_error()
        .ok_or(format!("not a database error: {e}"))?;
    want("sqlstate", db.code().as_deref(), Some("57P01"))?;
    Ok("DatabaseError code 57P01".into())
}

async fn connect_scram(t: &Target) -> StepResult {
    let mut c = connect(&t.dsn).await?;
    let u: String = sqlx::query_scalar("select current_user::text")
        .fetch_one(&mut c)
        .await
        .ctx("query")?;
    want("user", u.as_str(), "agent")?;
    Ok(String::new())
}

async fn connect_tls_cleartext(t: &Target) -> StepResult {
    let mut c = connect(&t.dsn_cleartext).await?;
    let v: String = sqlx::query_scalar("select 'in'")
        .fetch_one(&mut c)
        .await
        .ctx("query")?;
    want("select", v.as_str(), "in")?;
    Ok("rustls".into())
}

async fn create_table(c: &mut PgConnection) -> StepResult {
    c.execute("create table scenario(id int primary key, name text not null)")
        .await
        .ctx("create")?;
    Ok(String::new())
}

async fn insert_params(c: &mut PgConnection) -> StepResult {
    sqlx::query("insert into scenario values ($1, $2)")
        .bind(1i32)
        .bind("one")
        .execute(&mut *c)
        .await
        .ctx("insert")?;
    let name: String = sqlx::query_scalar("select name from scenario where id = $1")
        .bind(1i32)
        .fetch_one(&mut *c)
        .await
        .ctx("select")?;
    want("name", name.as_str(), "one")?;
    Ok(String::new())
}

async fn prepared_reuse(c: &mut PgConnection) -> StepResult {
    for i in 2..=4i32 {
        // sqlx keeps the prepared statement in its per-connection cache and re-executes it.
        sqlx::query("insert into scenario values ($1, $2)")
            .bind(i)
            .bind(format!("n{i}"))
            .execute(&mut *c)
            .await
            .ctx("insert")?;
    }
    let n: i64 = sqlx::query_scalar("select count(*) from scenario where id between 2 and 4")
        .fetch_one(&mut *c)
        .await
        .ctx("count")?;
    want("count", n, 3)?;
    let cached = c.cached_statements_size();
    if cached == 0 {
        return Err("no statement in sqlx's cache".into());
    }
    Ok(format!("statement cache ({cached})"))
}

async fn transaction_rollback(c: &mut PgConnection) -> StepResult {
    let mut tx = c.begin().await.ctx("begin")?;
    sqlx::query("insert into scenario values (100, 'gone')")
        .execute(&mut *tx)
        .await
        .ctx("insert")?;
    tx.rollback().await.ctx("rollback")?;
    let n: i64 = sqlx::query_scalar("select count(*) from scenario where id = 100")
        .fetch_one(&mut *c)
        .await
        .ctx("count")?;
    want("count", n, 0)?;
    Ok(String::new())
}

async fn savepoint(c: &mut PgConnection) -> StepResult {
    let mut tx = c.begin().await.ctx("begin")?;
    sqlx::query("insert into scenario values (200, 'kept')")
        .execute(&mut *tx)
        .await
        .ctx("insert")?;
    {
        // A transaction begun inside a transaction is a SAVEPOINT.
        let mut sp = tx.begin().await.ctx("savepoint")?;
        sqlx::query("insert into scenario values (201, 'undone')")
            .execute(&mut *sp)
            .await
            .ctx("insert")?;
        sp.rollback().await.ctx("rollback to savepoint")?;
    }
    tx.commit().await.ctx("commit")?;
    let ids: Vec<i32> = sqlx::query_scalar("select id from scenario where id >= 200 order by id")
        .fetch_all(&mut *c)
        .await
        .ctx("select")?;
    want("ids", ids, vec![200])?;
    Ok(String::new())
}

async fn copy_in(c: &mut PgConnection) -> StepResult {
    let mut copy = c
        .copy_in_raw("copy scenario (id, name) from stdin")
        .await
        .ctx("copy in")?;
    let data: String = (1000..2000).map(|i| format!("{i}\tcopied {i}\n")).collect();
    copy.send(data.as_bytes()).await.ctx("send")?;
    let n = copy.finish().await.ctx("finish")?;
    want("copied", n, 1000)?;
    Ok("copy_in_raw".into())
}

async fn copy_out(c: &mut PgConnection) -> StepResult {
    let mut data = Vec::new();
    {
        let mut stream = c
            .copy_out_raw("copy (select id, name from scenario where id between 1000 and 1999 order by id) to stdout")
            .await
            .ctx("copy out")?;
        while let Some(chunk) = stream.next().await {
            data.extend_from_slice(&chunk.ctx("read")?);
        }
    }
    let want_data: String = (1000..2000).map(|i| format!("{i}\tcopied {i}\n")).collect();
    want(
        "copy out bytes",
        String::from_utf8_lossy(&data).as_ref(),
        want_data.as_str(),
    )?;
    Ok("copy_out_raw".into())
}

async fn listen_notify(t: &Target) -> StepResult {
    let mut l = PgListener::connect(&t.dsn).await.ctx("listener")?;
    l.listen("scenario_ch").await.ctx("listen")?;
    let mut b = connect(&t.dsn).await?;
    b.execute("notify scenario_ch, 'hello from B'")
        .await
        .ctx("notify")?;
    let n = tokio::time::timeout(Duration::from_secs(10), l.recv())
        .await
        .ctx("waiting for the notification")?
        .ctx("recv")?;
    want("channel", n.channel(), "scenario_ch")?;
    want("payload", n.payload(), "hello from B")?;
    Ok("PgListener".into())
}

async fn unique_violation(c: &mut PgConnection) -> StepResult {
    let e = match sqlx::query("insert into scenario values ($1, $2)")
        .bind(1i32)
        .bind("dup")
        .execute(&mut *c)
        .await
    {
        Ok(_) => return Err("no error".into()),
        Err(e) => e,
    };
    let db = e
        .as_database_error()
        .ok_or(format!("not a database error: {e}"))?;
    want("sqlstate", db.code().as_deref(), Some("23505"))?;
    want("constraint", db.constraint(), Some("scenario_pkey"))?;
    Ok("SQLSTATE 23505".into())
}

async fn types_roundtrip(c: &mut PgConnection) -> StepResult {
    let n = "12345678901234567890.000000012345";
    let j = serde_json::json!({"k": [1, 2.5, "x"], "n": null});
    let ts = time::macros::datetime!(2024-02-29 23:59:59.123456 UTC);
    let b: Vec<u8> = (0..=255u8).collect();
    let a: Vec<Option<i32>> = vec![Some(1), Some(2), None, Some(4)];
    let tx: Vec<String> = vec!["a b".into(), "c,d".into(), String::new()];
    c.execute("create table types(n numeric, j jsonb, ts timestamptz, b bytea, a int[], t text[])")
        .await
        .ctx("create")?;
    // Without the bigdecimal/rust_decimal features, NUMERIC travels as text.
    sqlx::query("insert into types values ($1::text::numeric, $2, $3, $4, $5, $6)")
        .bind(n)
        .bind(sqlx::types::Json(&j))
        .bind(ts)
        .bind(&b)
        .bind(&a)
        .bind(&tx)
        .execute(&mut *c)
        .await
        .ctx("insert")?;
    let r = sqlx::query("select n::text, j, ts, b, a, t from types")
        .fetch_one(&mut *c)
        .await
        .ctx("select")?;
    want("numeric", r.try_get::<String, _>(0).ctx("n")?.as_str(), n)?;
    want(
        "jsonb",
        r.try_get::<sqlx::types::Json<serde_json::Value>, _>(1)
            .ctx("j")?
            .0,
        j,
    )?;
    want(
        "timestamptz",
        r.try_get::<time::OffsetDateTime, _>(2).ctx("ts")?,
        ts,
    )?;
    want("bytea", r.try_get::<Vec<u8>, _>(3).ctx("b")?, b)?;
    want("int[]", r.try_get::<Vec<Option<i32>>, _>(4).ctx("a")?, a)?;
    want("text[]", r.try_get::<Vec<String>, _>(5).ctx("t")?, tx)?;
    Ok("binary format; NUMERIC as text".into())
}

async fn cursor(c: &mut PgConnection) -> StepResult {
    // sqlx has no portal API: a SQL cursor, fetched in batches.
    let mut tx = c.begin().await.ctx("begin")?;
    tx.execute("declare c cursor for select g from generate_series(1, 1000) g")
        .await
        .ctx("declare")?;
    let mut got: Vec<i32> = Vec::new();
    loop {
        let rows: Vec<i32> = sqlx::query_scalar("fetch 150 from c")
            .fetch_all(&mut *tx)
            .await
            .ctx("fetch")?;
        if rows.is_empty() {
            break;
        }
        got.extend(rows);
    }
    tx.commit().await.ctx("commit")?;
    want("rows", got, (1..=1000).collect::<Vec<i32>>())?;
    Ok("DECLARE / FETCH 150".into())
}

async fn capped_select(t: &Target) -> StepResult {
    use tracing::instrument::WithSubscriber;
    // sqlx reports notices only as tracing events (target sqlx::postgres::notice): capture them.
    let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("sqlx::postgres::notice=trace")
        .with_ansi(false)
        .with_writer(move || Capture(sink.clone()))
        .finish();
    let dsn = t.dsn.clone();
    let rows = async move {
        let mut c = connect(&dsn).await?;
        sqlx::query("select * from generate_series(1, 100000)")
            .fetch_all(&mut c)
            .await
            .ctx("select")
    }
    .with_subscriber(subscriber)
    .await?;
    want("rows", rows.len(), 200)?;
    let log = String::from_utf8_lossy(&buf.lock().map_err(|_| "poisoned")?).into_owned();
    if !log.contains("sqlx::postgres::notice") {
        return Err("no NOTICE".into());
    }
    Ok(log.lines().next().unwrap_or("").chars().take(120).collect())
}

/// A tracing writer into a shared buffer.
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

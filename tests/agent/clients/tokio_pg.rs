//! The client scenario with tokio-postgres, through the gateway. TLS is tokio-rustls with a
//! connector written here (accepts the gateway's self-signed certificate, like
//! sslmode=require, and offers tls-server-end-point channel binding computed on its own).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_postgres::config::ChannelBinding as CbMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use super::matrix::{want, Ctx, StepResult, Steps};
use super::Target;

/// Connect and keep the connection polled; its notices and notifications arrive on the channel.
async fn open<T>(cfg: &Config, tls: T) -> Result<(Client, UnboundedReceiver<AsyncMessage>), String>
where
    T: MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut conn) = cfg.connect(tls).await.ctx("connect")?;
    let (tx, rx) = unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            let _ = tx.send(m);
        }
    });
    Ok((client, rx))
}

async fn plain(dsn: &str) -> Result<Client, String> {
    let cfg: Config = dsn.parse().ctx("parse DSN")?;
    Ok(open(&cfg, NoTls).await?.0)
}

pub async fn scenario(t: Target, caps: bool) -> String {
    let mut s = Steps::new(&super::matrix::locked_version("tokio-postgres"));
    s.record("connect_scram", connect_scram(&t).await);
    s.record("connect_tls_cleartext", connect_tls_cleartext(&t).await);
    s.record("channel_binding", channel_binding(&t).await);
    let c = match plain(&t.dsn).await {
        Ok(c) => c,
        Err(e) => {
            s.record("scenario", Err(e));
            return s.finish();
        }
    };
    s.record("create_table", create_table(&c).await);
    s.record("insert_params", insert_params(&c).await);
    s.record("prepared_reuse", prepared_reuse(&c).await);
    s.record("transaction_rollback", transaction_rollback(&c).await);
    let mut c = c;
    s.record("savepoint", savepoint(&mut c).await);
    s.record("copy_in", copy_in(&c).await);
    s.record("copy_out", copy_out(&c).await);
    s.record("listen_notify", listen_notify(&t).await);
    s.record("cancel", cancel(&t).await);
    s.record("unique_violation", unique_violation(&c).await);
    s.record("types_roundtrip", types_roundtrip(&c).await);
    s.record("cursor", cursor(&mut c).await);
    s.record(
        "write_returning_uncapped",
        write_returning_uncapped(&c).await,
    );
    match two_phase(&c).await {
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

async fn write_returning_uncapped(c: &Client) -> StepResult {
    c.batch_execute("create table returning_tokio(id serial primary key, g int)")
        .await
        .ctx("create")?;
    let rows = c
        .query(
            "insert into returning_tokio(g) select generate_series(1, 500) returning id",
            &[],
        )
        .await
        .ctx("insert … returning")?;
    want("rows returned", rows.len(), 500)?;
    Ok("INSERT … RETURNING of 500 rows".into())
}

/// `None`: the server has no prepared transactions (max_prepared_transactions = 0).
async fn two_phase(c: &Client) -> Result<Option<String>, String> {
    let mpt: String = c
        .query_one("show max_prepared_transactions", &[])
        .await
        .ctx("show")?
        .get(0);
    if mpt == "0" {
        return Ok(None);
    }
    c.batch_execute(
        "create table tpc_tokio(id int); begin; insert into tpc_tokio values (1); \
         prepare transaction 'sandpit-tokio'",
    )
    .await
    .ctx("prepare transaction")?;
    c.batch_execute("commit prepared 'sandpit-tokio'")
        .await
        .ctx("commit prepared")?;
    let n: i64 = c
        .query_one("select count(*) from tpc_tokio", &[])
        .await
        .ctx("count")?
        .get(0);
    want("committed rows", n, 1)?;
    Ok(Some(format!(
        "PREPARE TRANSACTION / COMMIT PREPARED (max_prepared_transactions = {mpt})"
    )))
}

async fn terminate_self(t: &Target) -> StepResult {
    let c = plain(&t.dsn).await?;
    let e = match c
        .execute("select pg_terminate_backend(pg_backend_pid())", &[])
        .await
    {
        Ok(_) => return Err("no error".into()),
        Err(e) => e,
    };
    want("sqlstate", e.code(), Some(&SqlState::ADMIN_SHUTDOWN))?;
    // The connection is gone: the next query fails without a second server error.
    if c.simple_query("select 1").await.is_ok() {
        return Err("the connection still answers".into());
    }
    Ok("Error::code() is ADMIN_SHUTDOWN (57P01)".into())
}

async fn connect_scram(t: &Target) -> StepResult {
    let c = plain(&t.dsn).await?;
    let u: String = c
        .query_one("select current_user::text", &[])
        .await
        .ctx("query")?
        .get(0);
    want("user", u.as_str(), "agent")?;
    Ok(String::new())
}

async fn connect_tls_cleartext(t: &Target) -> StepResult {
    let cfg: Config = t.dsn_cleartext.parse().ctx("parse DSN")?;
    let (c, _) = open(&cfg, RustlsConnect::new()).await?;
    let v: String = c.query_one("select 'in'", &[]).await.ctx("query")?.get(0);
    want("select", v.as_str(), "in")?;
    Ok("tokio-rustls".into())
}

async fn channel_binding(t: &Target) -> StepResult {
    let mut cfg: Config = t.dsn.parse().ctx("parse DSN")?;
    cfg.ssl_mode(tokio_postgres::config::SslMode::Require)
        .channel_binding(CbMode::Require);
    let (c, _) = open(&cfg, RustlsConnect::new()).await?;
    let v: i32 = c.query_one("select 1", &[]).await.ctx("query")?.get(0);
    want("select", v, 1)?;
    Ok("channel_binding=require".into())
}

async fn create_table(c: &Client) -> StepResult {
    c.batch_execute("create table scenario(id int primary key, name text not null)")
        .await
        .ctx("create")?;
    Ok(String::new())
}

async fn insert_params(c: &Client) -> StepResult {
    c.execute("insert into scenario values ($1, $2)", &[&1i32, &"one"])
        .await
        .ctx("insert")?;
    let name: String = c
        .query_one("select name from scenario where id = $1", &[&1i32])
        .await
        .ctx("select")?
        .get(0);
    want("name", name.as_str(), "one")?;
    Ok(String::new())
}

async fn prepared_reuse(c: &Client) -> StepResult {
    let st = c
        .prepare("insert into scenario values ($1, $2)")
        .await
        .ctx("prepare")?;
    for i in 2..=4i32 {
        c.execute(&st, &[&i, &format!("n{i}")])
            .await
            .ctx("execute")?;
    }
    let n: i64 = c
        .query_one(
            "select count(*) from scenario where id between 2 and 4",
            &[],
        )
        .await
        .ctx("count")?
        .get(0);
    want("count", n, 3)?;
    Ok("prepare once, execute 3 times".into())
}

async fn transaction_rollback(c: &Client) -> StepResult {
    c.batch_execute("begin; insert into scenario values (100, 'gone'); rollback")
        .await
        .ctx("transaction")?;
    let n: i64 = c
        .query_one("select count(*) from scenario where id = 100", &[])
        .await
        .ctx("count")?
        .get(0);
    want("count", n, 0)?;
    Ok(String::new())
}

async fn savepoint(c: &mut Client) -> StepResult {
    let mut tx = c.transaction().await.ctx("begin")?;
    tx.execute("insert into scenario values (200, 'kept')", &[])
        .await
        .ctx("insert")?;
    {
        let sp = tx.savepoint("s").await.ctx("savepoint")?;
        sp.execute("insert into scenario values (201, 'undone')", &[])
            .await
            .ctx("insert")?;
        sp.rollback().await.ctx("rollback to savepoint")?;
    }
    tx.commit().await.ctx("commit")?;
    let ids: Vec<i32> = c
        .query("select id from scenario where id >= 200 order by id", &[])
        .await
        .ctx("select")?
        .iter()
        .map(|r| r.get(0))
        .collect();
    want("ids", ids, vec![200])?;
    Ok(String::new())
}

async fn copy_in(c: &Client) -> StepResult {
    let sink = c
        .copy_in("copy scenario (id, name) from stdin")
        .await
        .ctx("copy in")?;
    let mut sink = std::pin::pin!(sink);
    let data: String = (1000..2000).map(|i| format!("{i}\tcopied {i}\n")).collect();
    sink.send(bytes::Bytes::from(data)).await.ctx("send")?;
    let n = sink.as_mut().finish().await.ctx("finish")?;
    want("copied", n, 1000)?;
    Ok(String::new())
}

async fn copy_out(c: &Client) -> StepResult {
    let stream = c
        .copy_out("copy (select id, name from scenario where id between 1000 and 1999 order by id) to stdout")
        .await
        .ctx("copy out")?;
    let mut stream = std::pin::pin!(stream);
    let mut data = Vec::new();
    while let Some(chunk) = stream.next().await {
        data.extend_from_slice(&chunk.ctx("read")?);
    }
    let want_data: String = (1000..2000).map(|i| format!("{i}\tcopied {i}\n")).collect();
    want(
        "copy out bytes",
        String::from_utf8_lossy(&data).as_ref(),
        want_data.as_str(),
    )?;
    Ok(String::new())
}

async fn listen_notify(t: &Target) -> StepResult {
    let cfg: Config = t.dsn.parse().ctx("parse DSN")?;
    let (a, mut a_msgs) = open(&cfg, NoTls).await?;
    let b = plain(&t.dsn).await?;
    a.batch_execute("listen scenario_ch").await.ctx("listen")?;
    b.batch_execute("notify scenario_ch, 'hello from B'")
        .await
        .ctx("notify")?;
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = a_msgs.recv().await {
            if let AsyncMessage::Notification(n) = m {
                return Some((n.channel().to_string(), n.payload().to_string()));
            }
        }
        None
    })
    .await
    .ctx("waiting for the notification")?;
    want(
        "notification",
        got,
        Some(("scenario_ch".to_string(), "hello from B".to_string())),
    )?;
    Ok(String::new())
}

async fn cancel(t: &Target) -> StepResult {
    let c = plain(&t.dsn).await?;
    let watcher = plain(&t.dsn).await?;
    let token = c.cancel_token();
    let started = std::time::Instant::now();
    let sleeper =
        tokio::spawn(async move { c.batch_execute("select pg_sleep(30) /* to cancel */").await });
    let mut seen = false;
    for _ in 0..200 {
        let n: i64 = watcher
            .query_one(
                "select count(*) from pg_stat_activity where state = 'active' and query like '%to cancel%' and pid <> pg_backend_pid()",
                &[],
            )
            .await
            .ctx("watch")?
            .get(0);
        if n > 0 {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !seen {
        return Err("the statement never became active".into());
    }
    token.cancel_query(NoTls).await.ctx("cancel_query")?;
    let r = sleeper.await.ctx("join")?;
    let e = match r {
        Ok(()) => return Err("pg_sleep(30) was not cancelled".into()),
        Err(e) => e,
    };
    want("sqlstate", e.code(), Some(&SqlState::QUERY_CANCELED))?;
    if started.elapsed() > Duration::from_secs(25) {
        return Err("cancel took too long".into());
    }
    Ok("CancelToken::cancel_query, SQLSTATE 57014".into())
}

async fn unique_violation(c: &Client) -> StepResult {
    let e = match c
        .execute("insert into scenario values ($1, $2)", &[&1i32, &"dup"])
        .await
    {
        Ok(_) => return Err("no error".into()),
        Err(e) => e,
    };
    want("sqlstate", e.code(), Some(&SqlState::UNIQUE_VIOLATION))?;
    let constraint = e
        .as_db_error()
        .and_then(|d| d.constraint().map(str::to_string));
    want("constraint", constraint.as_deref(), Some("scenario_pkey"))?;
    Ok("SQLSTATE 23505".into())
}

async fn types_roundtrip(c: &Client) -> StepResult {
    let n = "12345678901234567890.000000012345";
    let j = serde_json::json!({"k": [1, 2.5, "x"], "n": null});
    let ts = time::macros::datetime!(2024-02-29 23:59:59.123456 UTC);
    let b: Vec<u8> = (0..=255u8).collect();
    let a: Vec<Option<i32>> = vec![Some(1), Some(2), None, Some(4)];
    let tx: Vec<String> = vec!["a b".into(), "c,d".into(), String::new()];
    c.batch_execute(
        "create table types(n numeric, j jsonb, ts timestamptz, b bytea, a int[], t text[])",
    )
    .await
    .ctx("create")?;
    // tokio-postgres has no NUMERIC type of its own: it travels as text, cast on the server.
    c.execute(
        "insert into types values ($1::text::numeric, $2, $3, $4, $5, $6)",
        &[&n, &j, &ts, &b, &a, &tx],
    )
    .await
    .ctx("insert")?;
    let r = c
        .query_one("select n::text, j, ts, b, a, t from types", &[])
        .await
        .ctx("select")?;
    want("numeric", r.get::<_, String>(0).as_str(), n)?;
    want("jsonb", r.get::<_, serde_json::Value>(1), j)?;
    want("timestamptz", r.get::<_, time::OffsetDateTime>(2), ts)?;
    want("bytea", r.get::<_, Vec<u8>>(3), b)?;
    want("int[]", r.get::<_, Vec<Option<i32>>>(4), a)?;
    want("text[]", r.get::<_, Vec<String>>(5), tx)?;
    Ok("binary format; NUMERIC as text".into())
}

async fn cursor(c: &mut Client) -> StepResult {
    // A portal: Bind once, then Execute with a row limit until it runs dry.
    let tx = c.transaction().await.ctx("begin")?;
    let st = tx
        .prepare("select g from generate_series(1, 1000) g")
        .await
        .ctx("prepare")?;
    let portal = tx.bind(&st, &[]).await.ctx("bind")?;
    let mut got: Vec<i32> = Vec::new();
    let mut batches = 0;
    loop {
        let rows = tx.query_portal(&portal, 150).await.ctx("execute portal")?;
        if rows.is_empty() {
            break;
        }
        batches += 1;
        got.extend(rows.iter().map(|r| r.get::<_, i32>(0)));
    }
    tx.commit().await.ctx("commit")?;
    want("rows", got, (1..=1000).collect::<Vec<i32>>())?;
    Ok(format!("portal, {batches} batches of 150"))
}

async fn capped_select(t: &Target) -> StepResult {
    let cfg: Config = t.dsn.parse().ctx("parse DSN")?;
    let (c, mut msgs) = open(&cfg, NoTls).await?;
    let rows = c
        .query("select * from generate_series(1, 100000)", &[])
        .await
        .ctx("select")?;
    want("rows", rows.len(), 200)?;
    let notice = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(m) = msgs.recv().await {
            if let AsyncMessage::Notice(n) = m {
                return Some(n.message().to_string());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .ok_or("no NOTICE")?;
    Ok(notice)
}

/// A tokio-postgres TLS connector on tokio-rustls.
#[derive(Clone)]
pub struct RustlsConnect(Arc<rustls::ClientConfig>);

impl RustlsConnect {
    /// Accept any server certificate (sslmode=require semantics).
    pub fn new() -> RustlsConnect {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
            .with_no_client_auth();
        RustlsConnect(Arc::new(config))
    }
}

impl<S> MakeTlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnector;
    type Error = std::io::Error;

    fn make_tls_connect(&mut self, _host: &str) -> Result<RustlsConnector, std::io::Error> {
        Ok(RustlsConnector(self.0.clone()))
    }
}

/// One connection's TLS handshake.
pub struct RustlsConnector(Arc<rustls::ClientConfig>);

impl<S> TlsConnect<S> for RustlsConnector
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = std::io::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = std::io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = rustls::pki_types::ServerName::try_from("localhost")
                .map_err(std::io::Error::other)?;
            let s = tokio_rustls::TlsConnector::from(self.0)
                .connect(name, stream)
                .await?;
            Ok(RustlsStream(s))
        })
    }
}

/// A TLS stream that knows its tls-server-end-point binding.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // The gateway's certificate is ECDSA with SHA-256, so RFC 5929 says SHA-256.
        match self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
        {
            Some(cert) => {
                ChannelBinding::tls_server_end_point(Sha256::digest(cert.as_ref()).to_vec())
            }
            None => ChannelBinding::none(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Accepts any certificate, but still checks the handshake signatures with it.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

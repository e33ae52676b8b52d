//! A "shared" Postgres server standing in for one the user already runs: started with the
//! project's own code (initdb + postgres as the unprivileged user), listening on a unix socket
//! (trust, for the test's own checks) and on 127.0.0.1 with TLS only (SCRAM), which is how the
//! `template` provider reaches it.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use sandpit::pg::process::{self, ServerSpec};
use sandpit::pg::{self as pgbin, user};
use sandpit::provider::golden;

/// Admin role of the shared server.
pub const ADMIN: &str = "sp_admin";

/// A running server; stopped (immediate shutdown) on drop, even when a test panics.
pub struct SharedPg {
    /// TCP port on 127.0.0.1 (TLS only).
    pub port: u16,
    /// Directory of its unix socket.
    pub socket_dir: PathBuf,
    /// Password of `ADMIN`.
    pub admin_password: String,
    /// The server's self-signed certificate (PEM), to verify it with.
    pub ca_file: PathBuf,
    pid: i32,
    _child: tokio::process::Child,
    _tmp: tempfile::TempDir,
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn write_owned(path: &Path, text: &[u8], run_as: &user::RunAs) {
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    run_as.chown(path).expect("chown");
}

impl SharedPg {
    /// initdb, TLS material, pg_hba, start, with `max_connections = 100`. Needs a tokio runtime.
    pub async fn start() -> SharedPg {
        Self::start_with(100).await
    }

    /// As [`SharedPg::start`], with room for `max_connections` sessions (bench bursts).
    pub async fn start_with(max_connections: u32) -> SharedPg {
        let bins = pgbin::find_binaries(None).expect("postgres binaries");
        let run_as = user::resolve(None).expect("postgres OS user");
        let tmp = super::tempdir::tempdir();
        let data = tmp.path().join("data");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&data)
            .expect("mkdir");
        run_as.chown(&data).expect("chown");
        let admin_password = sandpit::auth::new_secret();
        let pwfile = tmp.path().join("pw");
        write_owned(&pwfile, admin_password.as_bytes(), &run_as);
        let mut cmd = process::command(&bins.initdb, &run_as, false);
        cmd.arg("-D")
            .arg(&data)
            .args([
                "-U",
                ADMIN,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(["-E", "UTF8", "--locale=C", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let out = cmd.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::remove_file(&pwfile).expect("rm pwfile");

        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("cert");
        write_owned(
            &data.join("server.crt"),
            cert.cert.pem().as_bytes(),
            &run_as,
        );
        let ca_file = tmp.path().join("ca.pem");
        std::fs::write(&ca_file, cert.cert.pem()).expect("ca copy");
        write_owned(
            &data.join("server.key"),
            cert.key_pair.serialize_pem().as_bytes(),
            &run_as,
        );
        // TCP only with TLS: proves the template provider's connections are encrypted.
        let hba = "local all all trust\n\
                   hostssl all all 127.0.0.1/32 scram-sha-256\n\
                   host all all 0.0.0.0/0 reject\n";
        write_owned(&data.join("pg_hba.conf"), hba.as_bytes(), &run_as);

        let socket_dir = tmp.path().join("s");
        golden::prepare_socket_dir(&socket_dir, &run_as).expect("socket dir");
        let port = free_port();
        let extra = [
            ("listen_addresses", "127.0.0.1".to_string()),
            ("port", port.to_string()),
            ("ssl", "on".to_string()),
            ("ssl_cert_file", "server.crt".to_string()),
            ("ssl_key_file", "server.key".to_string()),
            // Tasks may use two-phase commit; destroy must still succeed.
            ("max_prepared_transactions", "10".to_string()),
        ];
        let log = tmp.path().join("postgres.log");
        let spec = ServerSpec {
            bins: &bins,
            run_as: &run_as,
            netns: false,
            data: &data,
            socket_dir: &socket_dir,
            log: &log,
            max_connections,
            extra: &extra,
        };
        let child = process::start_postgres(&spec)
            .await
            .expect("start shared server");
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        SharedPg {
            port,
            socket_dir,
            admin_password,
            ca_file,
            pid,
            _child: child,
            _tmp: tmp,
        }
    }

    /// The DSN the gateway's `[template] admin_dsn` gets (TCP; TLS from `sslmode`).
    pub fn admin_dsn(&self) -> String {
        format!(
            "postgresql://{ADMIN}:{}@127.0.0.1:{}/postgres",
            self.admin_password, self.port
        )
    }

    /// Creates the database `sandpit_registry` and returns the URL a gateway's
    /// `[registry] url` gets (with `sslmode = "verify-full"` and `ca_file` this server's CA).
    #[allow(dead_code)]
    pub async fn registry_database(&self) -> String {
        self.admin("postgres")
            .await
            .batch_execute("CREATE DATABASE sandpit_registry")
            .await
            .expect("registry database");
        self.admin_dsn().replace("/postgres", "/sandpit_registry")
    }

    /// The server's log file (stderr of the postmaster).
    #[allow(dead_code)]
    pub fn log_path(&self) -> PathBuf {
        self._tmp.path().join("postgres.log")
    }

    /// Replaces `pg_hba.conf` and reloads the server.
    #[allow(dead_code)]
    pub async fn set_hba(&self, text: &str) {
        let run_as = user::resolve(None).expect("postgres OS user");
        write_owned(
            &self._tmp.path().join("data").join("pg_hba.conf"),
            text.as_bytes(),
            &run_as,
        );
        self.admin("postgres")
            .await
            .batch_execute("select pg_reload_conf()")
            .await
            .expect("reload");
    }

    /// An admin session over the unix socket, for the test's own checks.
    pub async fn admin(&self, db: &str) -> tokio_postgres::Client {
        let (c, conn) = tokio_postgres::Config::new()
            .host_path(&self.socket_dir)
            .port(self.port)
            .user(ADMIN)
            .dbname(db)
            .connect(tokio_postgres::NoTls)
            .await
            .expect("admin connect over the socket");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        c
    }
}

impl Drop for SharedPg {
    fn drop(&mut self) {
        process::signal(self.pid, Signal::SIGQUIT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while process::pid_alive(self.pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        process::signal_group(self.pid, Signal::SIGKILL);
    }
}

//! The `sandpit` binary's command line: every command, its arguments and their help text
//! (clap derives). Kept apart from main.rs, which runs the commands, and beside the CLI's
//! client side in `cli/`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sandpit",
    version,
    about = "A throwaway Postgres database per AI-agent task, behind one gateway"
)]
pub struct Cli {
    /// Config file (TOML).
    #[arg(long, global = true, env = "SANDPIT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data dir (tokens, logs, keys, Postgres data).
    #[arg(long, global = true, env = "SANDPIT_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Issue, list, show and revoke tokens.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Run one janitor pass on the running gateway and print what it found: backends of
    /// expired, revoked or unknown tokens are destroyed, vanished ones forgotten.
    Reap {
        /// Only report what a pass would do.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Print the statement log of a token (by id or DSN) or of every token of a task (by name).
    Log {
        /// Token id (or the token's DSN) or task name.
        target: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Serve MCP (Model Context Protocol) on stdio, bound to one token's DSN.
    Mcp {
        /// The token's DSN, as `token issue` prints it.
        #[arg(long, env = "SANDPIT_DSN", hide_env_values = true)]
        dsn: String,
        /// Control API base URL; given, `review_changes` is offered (asked of the API's
        /// `/mcp` with the token, never the admin key).
        #[arg(long, env = "SANDPIT_API")]
        api: Option<String>,
    },
    /// Golden versions: build one from a live database (masked), list them, switch new
    /// tokens to one.
    Golden {
        #[command(subcommand)]
        cmd: GoldenCmd,
    },
    /// What a token's agent changed: schema and data diff against the golden, or the SQL patch;
    /// `review approve|reject ID --comment TEXT` records a decision.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Review {
        #[command(subcommand)]
        decide: Option<ReviewCmd>,
        /// Token id, or the token's DSN (only the id is used).
        #[arg(required = true)]
        id: Option<String>,
        /// text, json, sql or html.
        #[arg(long, default_value = "text")]
        format: String,
        /// Compare every table, not only those Postgres' counters show as touched.
        #[arg(long)]
        full_scan: bool,
        /// Replay the patch on a fresh fork of the golden and say whether it rebuilds the
        /// scratch database.
        #[arg(long)]
        verify: bool,
        /// Control API base URL.
        #[arg(long, env = "SANDPIT_API")]
        api: Option<String>,
    },
    /// Apply a token's approved change to a target database in one transaction, guarded
    /// against the golden (nothing is applied if the target moved since).
    Promote {
        /// Token id, or the token's DSN (only the id is used).
        id: String,
        /// Target DSN; prefer the environment variable, which stays off the command line.
        /// Default: the source the token's golden was built from (if live), else the target
        /// named "default".
        #[arg(long, env = "SANDPIT_PROMOTE_TARGET", hide_env_values = true)]
        target: Option<String>,
        /// A target named under [promote.targets] instead of a DSN.
        #[arg(long, conflicts_with = "target")]
        target_name: Option<String>,
        /// Role to apply the change as (SET ROLE).
        #[arg(long)]
        role: Option<String>,
        /// Report what would happen, conflicts included, and commit nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Subcommand)]
pub enum ReviewCmd {
    /// Approve a token's change (blocked while a validator fails).
    Approve {
        /// Token id, or the token's DSN.
        id: String,
        /// Why.
        #[arg(long, default_value = "")]
        comment: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Reject a token's change.
    Reject {
        /// Token id, or the token's DSN.
        id: String,
        /// Why (required).
        #[arg(long)]
        comment: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Args)]
pub struct ServeArgs {
    /// Postgres listener.
    #[arg(long, env = "SANDPIT_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// HTTP API listener.
    #[arg(long, env = "SANDPIT_API_LISTEN")]
    pub api_listen: Option<SocketAddr>,
    /// SQL file to build the golden from (default: the shipped demo shop).
    #[arg(long)]
    pub golden_sql: Option<PathBuf>,
    /// Log format: "text" or "json".
    #[arg(long, default_value = "text", env = "SANDPIT_LOG_FORMAT")]
    pub log_format: String,
    /// Validate the configuration (file, environment, flags) and exit 0, or print the
    /// problem and exit 1, without starting anything.
    #[arg(long)]
    pub check_config: bool,
}

#[derive(Args)]
pub struct ApiArgs {
    /// Control API base URL.
    #[arg(long, env = "SANDPIT_API")]
    pub api: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Issue a token; prints the DSN (or the whole object with --json).
    Issue {
        /// Task name.
        #[arg(long)]
        task: String,
        /// Time to live, e.g. 15m, 2h.
        #[arg(long)]
        ttl: Option<humantime::Duration>,
        /// Rows per statement.
        #[arg(long)]
        max_rows: Option<u64>,
        /// Bytes of row data per statement, e.g. 1MiB.
        #[arg(long)]
        max_bytes: Option<String>,
        /// What a capped result does: truncate (default) or error.
        #[arg(long)]
        cap_mode: Option<String>,
        /// Seatbelt: statement kinds allowed, comma-separated (read,write,ddl,transaction,privilege,utility or all).
        #[arg(long, value_delimiter = ',')]
        allow: Option<Vec<String>>,
        /// Concurrent sessions for this token.
        #[arg(long)]
        max_connections: Option<u32>,
        /// Statement timeout, e.g. 30s (0s = none).
        #[arg(long)]
        statement_timeout: Option<humantime::Duration>,
        /// Idle-in-transaction timeout, e.g. 5m (0s = none).
        #[arg(long)]
        idle_in_transaction_timeout: Option<humantime::Duration>,
        /// Metadata key=value (repeatable).
        #[arg(long = "meta")]
        meta: Vec<String>,
        /// Sessions log in as a superuser of the token's own VM (microvm provider only;
        /// refused by any other provider).
        #[arg(long)]
        superuser: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// List tokens.
    List {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Show one token.
    Show {
        /// Token id, or the token's DSN (only the id is used).
        id: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Revoke a token: ends its sessions, stores its review and destroys its scratch database.
    Revoke {
        /// Token id, or the token's DSN as `token issue` printed it (only the id is used).
        id: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Destroy an ended token's scratch data although its review could not be stored.
    Discard {
        /// Token id, or the token's DSN (only the id is used).
        id: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Subcommand)]
pub enum GoldenCmd {
    /// Build a new golden version from a live database (read only), masked by a rules file.
    Build {
        /// Source DSN; prefer the environment variable, which stays off the command line.
        #[arg(long, env = "SANDPIT_GOLDEN_SOURCE_DSN", hide_env_values = true)]
        from_dsn: String,
        /// Copy only this schema (repeatable; default all).
        #[arg(long = "schema")]
        schemas: Vec<String>,
        /// Leave this table out (repeatable; pg_dump pattern).
        #[arg(long = "exclude-table")]
        exclude_tables: Vec<String>,
        /// Masking rules (TOML: [columns] "table.column" = "RULE", [tables] "t" = "sample:N").
        #[arg(long)]
        mask: Option<PathBuf>,
        /// Use the new version for new tokens right away.
        #[arg(long = "use")]
        activate: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// List golden versions (`*` marks the one new tokens get).
    List {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// New tokens get this version from now on; existing forks keep theirs.
    Use {
        /// Version id, as `golden list` shows it.
        version: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

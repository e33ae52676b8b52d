// The client scenario with pgjdbc (the PostgreSQL JDBC driver, Java's own protocol
// implementation), through the gateway. Compiled and run by tests/agent/clients.rs against
// Debian's libpostgresql-jdbc-java.
//
// pgjdbc uses the extended protocol: unnamed statements until a PreparedStatement has run
// prepareThreshold times (then a named one, S_1, S_2, ...), a batch as many Bind/Execute before
// one Sync, setFetchSize as a portal fetched with Execute(max_rows), and cancel() as a
// CancelRequest on a new connection.
//
// In: SANDPIT_DSN (postgresql://<id>:<secret>@host:port/db), SANDPIT_DSN_CLEARTEXT (user
// agent, password <id>.<secret>), SANDPIT_CAPS=1 to run the capped SELECT too.
// Out: one `STEP <name> ok|fail|skip <detail>` line per step; exit 1 if any failed.

import java.math.BigDecimal;
import java.net.URI;
import java.sql.*;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.*;

import org.postgresql.PGConnection;
import org.postgresql.PGNotification;
import org.postgresql.PGStatement;
import org.postgresql.copy.CopyManager;
import org.postgresql.util.PSQLException;

public class Scenario {
  interface Step {
    String run() throws Exception;
  }

  static boolean failed = false;
  static String host;
  static int port;
  static String db;
  static String user;
  static String password;

  static void step(String name, Step s) {
    try {
      String detail = s.run();
      System.out.println("STEP " + name + " ok " + (detail == null ? "" : detail));
    } catch (Throwable e) {
      failed = true;
      String msg = (e.getClass().getSimpleName() + ": " + e.getMessage()).replace('\n', ' ');
      System.out.println("STEP " + name + " fail " + msg.substring(0, Math.min(600, msg.length())));
    }
    System.out.flush();
  }

  static void want(String what, Object got, Object expected) {
    if (!Objects.equals(got, expected)) {
      throw new AssertionError(what + ": got " + got + ", want " + expected);
    }
  }

  static Connection connect(String u, String pw, String sslmode, String extra) throws SQLException {
    Properties p = new Properties();
    p.setProperty("user", u);
    p.setProperty("password", pw);
    p.setProperty("sslmode", sslmode);
    String url = "jdbc:postgresql://" + host + ":" + port + "/" + db + extra;
    return DriverManager.getConnection(url, p);
  }

  /** The issued DSN's login (SCRAM); sslmode=prefer, as libpq-based clients default to. */
  static Connection connect() throws SQLException {
    return connect(user, password, "prefer", "");
  }

  static long count(Connection c, String sql) throws SQLException {
    try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery(sql)) {
      rs.next();
      return rs.getLong(1);
    }
  }

  /** Runs `pg_sleep(30)` on `c` and cancels it with Statement.cancel() once it is active. */
  static SQLException cancelRunning(Connection c, Connection watcher) throws Exception {
    Statement s = c.createStatement();
    List<String> problems = Collections.synchronizedList(new ArrayList<>());
    Thread t = new Thread(() -> {
      try {
        for (int i = 0; i < 200; i++) {
          if (count(watcher, "select count(*) from pg_stat_activity where state = 'active' "
              + "and query like '%jdbc cancel%' and pid <> pg_backend_pid()") > 0) {
            s.cancel();
            return;
          }
          Thread.sleep(50);
        }
        problems.add("the statement never became active");
      } catch (Exception e) {
        problems.add(e.toString());
      }
    });
    t.start();
    long start = System.nanoTime();
    SQLException got = null;
    try {
      s.execute("select pg_sleep(30) /* jdbc cancel */");
    } catch (SQLException e) {
      got = e;
    }
    t.join();
    if (!problems.isEmpty()) throw new AssertionError("cancel(): " + problems.get(0));
    if (got == null) throw new AssertionError("pg_sleep(30) was not cancelled");
    if ((System.nanoTime() - start) / 1_000_000_000L > 25) throw new AssertionError("cancel took too long");
    return got;
  }

  public static void main(String[] args) throws Exception {
    URI dsn = new URI(System.getenv("SANDPIT_DSN"));
    host = dsn.getHost();
    port = dsn.getPort();
    db = dsn.getPath().substring(1);
    String[] cred = dsn.getRawUserInfo().split(":", 2);
    user = cred[0];
    password = cred[1];
    boolean caps = "1".equals(System.getenv("SANDPIT_CAPS"));
    System.out.println("VERSION " + org.postgresql.util.DriverInfo.DRIVER_VERSION);

    step("connect_scram", () -> {
      try (Connection c = connect()) {
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("select current_user")) {
          rs.next();
          want("user", rs.getString(1), "agent");
        }
      }
      return "SCRAM-SHA-256";
    });
    step("connect_tls_cleartext", () -> {
      // The gateway refuses cleartext without TLS from loopback: this login used TLS.
      try (Connection c = connect("agent", user + "." + password, "require", "")) {
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("select 'in'")) {
          rs.next();
          want("select", rs.getString(1), "in");
        }
      }
      return "sslmode=require";
    });
    System.out.println("STEP channel_binding skip pgjdbc " + org.postgresql.util.DriverInfo.DRIVER_VERSION
        + " has no channel binding (no SCRAM-SHA-256-PLUS)");

    step("create_table", () -> {
      try (Connection c = connect(); Statement s = c.createStatement()) {
        s.execute("create table scenario(id int primary key, name text not null)");
      }
      return null;
    });
    step("insert_params", () -> {
      try (Connection c = connect();
          PreparedStatement ins = c.prepareStatement("insert into scenario values (?, ?)");
          PreparedStatement sel = c.prepareStatement("select name from scenario where id = ?")) {
        ins.setInt(1, 1);
        ins.setString(2, "one");
        ins.executeUpdate();
        sel.setInt(1, 1);
        try (ResultSet rs = sel.executeQuery()) {
          rs.next();
          want("row", rs.getString(1), "one");
        }
      }
      return null;
    });
    step("prepared_reuse", () -> {
      try (Connection c = connect();
          PreparedStatement ins = c.prepareStatement("insert into scenario values (?, ?)")) {
        // A named server-side statement from the first execution on.
        ins.unwrap(PGStatement.class).setPrepareThreshold(1);
        for (int i = 2; i <= 4; i++) {
          ins.setInt(1, i);
          ins.setString(2, "n" + i);
          ins.executeUpdate();
        }
        long n = count(c, "select count(*) from pg_prepared_statements");
        if (n < 1) throw new AssertionError("no prepared statement on the server");
        want("count", count(c, "select count(*) from scenario where id between 2 and 4"), 3L);
        return n + " server-side prepared (prepareThreshold=1)";
      }
    });
    step("transaction_rollback", () -> {
      try (Connection c = connect(); Statement s = c.createStatement()) {
        c.setAutoCommit(false);
        s.execute("insert into scenario values (100, 'gone')");
        c.rollback();
        want("count", count(c, "select count(*) from scenario where id = 100"), 0L);
      }
      return null;
    });
    step("savepoint", () -> {
      try (Connection c = connect(); Statement s = c.createStatement()) {
        c.setAutoCommit(false);
        s.execute("insert into scenario values (200, 'kept')");
        Savepoint sp = c.setSavepoint();
        try {
          s.execute("insert into scenario values (201, 'undone')");
          s.execute("insert into scenario values (200, 'dup')");
          throw new AssertionError("no unique violation");
        } catch (SQLException e) {
          want("sqlstate", e.getSQLState(), "23505");
          c.rollback(sp);
        }
        c.commit();
        List<Integer> ids = new ArrayList<>();
        try (ResultSet rs = s.executeQuery("select id from scenario where id >= 200 order by id")) {
          while (rs.next()) ids.add(rs.getInt(1));
        }
        want("ids", ids, List.of(200));
      }
      return null;
    });
    step("copy_in", () -> {
      try (Connection c = connect()) {
        StringBuilder sb = new StringBuilder();
        for (int i = 1000; i < 2000; i++) sb.append(i).append("\tcopied ").append(i).append('\n');
        CopyManager cm = c.unwrap(PGConnection.class).getCopyAPI();
        long n = cm.copyIn("copy scenario (id, name) from stdin", new java.io.StringReader(sb.toString()));
        want("copied", n, 1000L);
        want("count", count(c, "select count(*) from scenario where name like 'copied %'"), 1000L);
      }
      return "CopyManager.copyIn";
    });
    step("copy_out", () -> {
      try (Connection c = connect()) {
        java.io.StringWriter w = new java.io.StringWriter();
        CopyManager cm = c.unwrap(PGConnection.class).getCopyAPI();
        long n = cm.copyOut("copy (select id, name from scenario where id between 1000 and 1999 order by id) to stdout", w);
        want("copied", n, 1000L);
        String[] lines = w.toString().split("\n");
        want("rows", lines.length, 1000);
        want("first", lines[0], "1000\tcopied 1000");
      }
      return "CopyManager.copyOut";
    });
    step("listen_notify", () -> {
      try (Connection a = connect(); Connection b = connect();
          Statement sa = a.createStatement(); Statement sb = b.createStatement()) {
        sa.execute("listen scenario_ch");
        sb.execute("notify scenario_ch, 'hello from B'");
        PGNotification[] got = a.unwrap(PGConnection.class).getNotifications(10_000);
        if (got == null || got.length != 1) throw new AssertionError("notifications: " + Arrays.toString(got));
        want("channel", got[0].getName(), "scenario_ch");
        want("payload", got[0].getParameter(), "hello from B");
      }
      return null;
    });
    step("cancel", () -> {
      try (Connection c = connect(); Connection watcher = connect()) {
        want("sqlstate", cancelRunning(c, watcher).getSQLState(), "57014");
        want("after cancel", count(c, "select 7"), 7L);
      }
      return "Statement.cancel(), SQLSTATE 57014";
    });
    step("unique_violation", () -> {
      try (Connection c = connect();
          PreparedStatement ins = c.prepareStatement("insert into scenario values (?, ?)")) {
        ins.setInt(1, 1);
        ins.setString(2, "dup");
        try {
          ins.executeUpdate();
          throw new AssertionError("no error");
        } catch (PSQLException e) {
          want("sqlstate", e.getSQLState(), "23505");
          want("constraint", e.getServerErrorMessage().getConstraint(), "scenario_pkey");
        }
      }
      return "PSQLException, SQLSTATE 23505";
    });
    step("types_roundtrip", () -> {
      BigDecimal n = new BigDecimal("12345678901234567890.000000012345");
      String j = "{\"k\": [1, 2.5, \"x\"], \"n\": null}";
      OffsetDateTime ts = OffsetDateTime.of(2024, 2, 29, 23, 59, 59, 123456000, ZoneOffset.UTC);
      byte[] b = new byte[256];
      for (int i = 0; i < 256; i++) b[i] = (byte) i;
      try (Connection c = connect(); Statement s = c.createStatement()) {
        s.execute("create table types(n numeric, j jsonb, ts timestamptz, b bytea, a int[], t text[])");
        try (PreparedStatement ins = c.prepareStatement("insert into types values (?, ?::jsonb, ?, ?, ?, ?)")) {
          ins.setBigDecimal(1, n);
          ins.setString(2, j);
          ins.setObject(3, ts);
          ins.setBytes(4, b);
          ins.setArray(5, c.createArrayOf("int4", new Integer[] {1, 2, null, 4}));
          ins.setArray(6, c.createArrayOf("text", new String[] {"a b", "c,d", ""}));
          ins.executeUpdate();
        }
        for (int threshold : new int[] {5, -1}) {
          // -1: every statement named and its results binary (pgjdbc's binary transfer).
          try (PreparedStatement sel = c.prepareStatement("select n, j, ts, b, a, t from types")) {
            sel.unwrap(PGStatement.class).setPrepareThreshold(threshold);
            try (ResultSet rs = sel.executeQuery()) {
              rs.next();
              String how = "(prepareThreshold " + threshold + ") ";
              want(how + "numeric", rs.getBigDecimal(1), n);
              want(how + "jsonb", rs.getString(2), j);
              want(how + "timestamptz", rs.getObject(3, OffsetDateTime.class), ts);
              want(how + "bytea", Arrays.toString(rs.getBytes(4)), Arrays.toString(b));
              want(how + "int[]", Arrays.toString((Object[]) rs.getArray(5).getArray()), "[1, 2, null, 4]");
              want(how + "text[]", Arrays.asList((Object[]) rs.getArray(6).getArray()), List.of("a b", "c,d", ""));
            }
          }
        }
      }
      return "text and binary results";
    });
    step("cursor", () -> {
      try (Connection c = connect()) {
        c.setAutoCommit(false);
        try (Statement s = c.createStatement()) {
          s.setFetchSize(150);
          List<Integer> got = new ArrayList<>();
          try (ResultSet rs = s.executeQuery("select g from generate_series(1, 1000) g")) {
            while (rs.next()) got.add(rs.getInt(1));
          }
          List<Integer> all = new ArrayList<>();
          for (int i = 1; i <= 1000; i++) all.add(i);
          want("rows", got, all);
        }
        c.commit();
      }
      return "setFetchSize(150): a portal fetched 150 rows at a time";
    });
    step("notify_backend_pid", () -> {
      try (Connection c = connect(); Statement s = c.createStatement()) {
        int pid = c.unwrap(PGConnection.class).getBackendPID();
        want("pg_backend_pid()", count(c, "select pg_backend_pid()"), (long) pid);
        s.execute("listen own_ch");
        s.execute("notify own_ch, 'mine'");
        PGNotification[] got = c.unwrap(PGConnection.class).getNotifications(10_000);
        if (got == null || got.length != 1) throw new AssertionError("notifications: " + Arrays.toString(got));
        want("notification", got[0].getName() + "/" + got[0].getParameter() + "/" + got[0].getPID(),
            "own_ch/mine/" + pid);
      }
      return "PGNotification.getPID() == getBackendPID()";
    });
    step("terminate_self", () -> {
      Connection c = connect();
      try (Statement s = c.createStatement()) {
        int pid = c.unwrap(PGConnection.class).getBackendPID();
        try {
          s.execute("select pg_terminate_backend(" + pid + ")");
          throw new AssertionError("no error");
        } catch (PSQLException e) {
          want("sqlstate", e.getSQLState(), "57P01");
        }
        want("closed", c.isClosed(), true);
      } finally {
        c.close();
      }
      return "pg_terminate_backend(getBackendPID()) raises 57P01, connection closed";
    });
    try (Connection c = connect(); Statement s = c.createStatement()) {
      long mpt;
      try (ResultSet rs = s.executeQuery("show max_prepared_transactions")) {
        rs.next();
        mpt = Long.parseLong(rs.getString(1));
      }
      if (mpt == 0) {
        System.out.println("STEP two_phase skip max_prepared_transactions is 0 on this server");
      } else {
        step("two_phase", () -> {
          s.execute("create table tpc_scenario(id int)");
          // The SQL spelling (pgjdbc's XA API needs a PGXADataSource), committed then rolled back.
          s.execute("begin");
          s.execute("insert into tpc_scenario values (1)");
          s.execute("prepare transaction 'sandpit-jdbc-1'");
          want("prepared", count(c, "select count(*) from pg_prepared_xacts where gid = 'sandpit-jdbc-1'"), 1L);
          s.execute("commit prepared 'sandpit-jdbc-1'");
          s.execute("begin");
          s.execute("insert into tpc_scenario values (2)");
          s.execute("prepare transaction 'sandpit-jdbc-2'");
          s.execute("rollback prepared 'sandpit-jdbc-2'");
          want("rows", count(c, "select count(*) from tpc_scenario"), 1L);
          want("left prepared", count(c, "select count(*) from pg_prepared_xacts"), 0L);
          return "PREPARE TRANSACTION / COMMIT PREPARED / ROLLBACK PREPARED (max_prepared_transactions = " + mpt + ")";
        });
      }
    } catch (SQLException e) {
      failed = true;
      System.out.println("STEP two_phase fail " + e.toString().replace('\n', ' '));
    }
    step("write_returning_uncapped", () -> {
      try (Connection c = connect(); Statement s = c.createStatement()) {
        s.execute("create table returning_scenario(id serial primary key, g int)");
        int n = 0;
        try (ResultSet rs = s.executeQuery(
            "insert into returning_scenario(g) select g from generate_series(1, 500) g returning id")) {
          while (rs.next()) n++;
        }
        want("rows returned", n, 500);
        // And the generated keys of a batch, the way an ORM asks for them.
        try (PreparedStatement ins = c.prepareStatement(
            "insert into returning_scenario(g) values (?)", new String[] {"id"})) {
          for (int i = 0; i < 300; i++) {
            ins.setInt(1, i);
            ins.addBatch();
          }
          ins.executeBatch();
          int keys = 0;
          try (ResultSet rs = ins.getGeneratedKeys()) {
            while (rs.next()) keys++;
          }
          want("generated keys of a batch of 300", keys, 300);
        }
      }
      return "INSERT … RETURNING of 500 rows and a batch's 300 generated keys under max_rows 200";
    });
    step("catalog_uncapped", () -> {
      try (Connection c = connect(); Statement s = c.createStatement()) {
        long n = count(c, "select count(*) from pg_catalog.pg_type");
        if (n <= 200) throw new AssertionError("pg_type has only " + n + " rows: the step needs more than 200");
        long got = 0;
        try (ResultSet rs = s.executeQuery("select oid, typname from pg_catalog.pg_type")) {
          while (rs.next()) got++;
        }
        want("pg_type rows", got, n);
        return "all " + n + " rows of pg_type under max_rows 200";
      }
    });
    if (caps) {
      step("capped_select", () -> {
        try (Connection c = connect(); Statement s = c.createStatement()) {
          int n = 0;
          SQLWarning w;
          try (ResultSet rs = s.executeQuery("select * from generate_series(1, 100000)")) {
            while (rs.next()) n++;
            w = s.getWarnings();
          }
          want("rows", n, 200);
          if (w == null) throw new AssertionError("no NOTICE");
          return w.getMessage();
        }
      });
    } else {
      System.out.println("STEP capped_select skip SANDPIT_CAPS is not 1");
    }
    System.exit(failed ? 1 : 0);
  }
}

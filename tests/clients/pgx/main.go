// The client scenario with pgx (Go's pure-Go driver: its own protocol code, no libpq),
// through the gateway. Built by tests/agent/clients.rs with Debian's Go and pgx v4
// (golang-github-jackc-pgx-v4-dev, GOPATH mode: no module download).
//
// pgx describes every new statement before running it (Parse/Describe/Sync, then
// Bind/Execute/Sync), keeps its statements by name in a cache, asks for binary results where
// it knows the type, sends a Batch as one pipeline with one Sync, copies in binary COPY, and
// cancels with a CancelRequest on a new connection.
//
// In: SANDPIT_DSN (from `token issue`), SANDPIT_DSN_CLEARTEXT (agent / <id>.<secret>,
// sslmode=require), SANDPIT_CAPS=1 to run the capped SELECT too.
// Out: one `STEP <name> ok|fail|skip <detail>` line per step; exit 1 if any failed.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgtype"
	"github.com/jackc/pgx/v4"
)

var (
	dsn    = os.Getenv("SANDPIT_DSN")
	clear  = os.Getenv("SANDPIT_DSN_CLEARTEXT")
	failed = false
	bg     = context.Background()
)

func step(name string, fn func() (string, error)) {
	detail, err := func() (d string, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return fn()
	}()
	if err != nil {
		failed = true
		msg := strings.ReplaceAll(fmt.Sprintf("%T: %v", err, err), "\n", " ")
		if len(msg) > 600 {
			msg = msg[:600]
		}
		fmt.Printf("STEP %s fail %s\n", name, msg)
		return
	}
	fmt.Printf("STEP %s ok %s\n", name, detail)
}

func want(what string, got, expected interface{}) error {
	if !reflect.DeepEqual(got, expected) {
		return fmt.Errorf("%s: got %#v, want %#v", what, got, expected)
	}
	return nil
}

func connect(url string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	return pgx.Connect(ctx, url)
}

func count(c *pgx.Conn, sql string, args ...interface{}) (int64, error) {
	var n int64
	err := c.QueryRow(bg, sql, args...).Scan(&n)
	return n, err
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// with runs fn on a new connection of the issued DSN, closed however fn ends.
func with(fn func(c *pgx.Conn) (string, error)) (string, error) {
	c, err := connect(dsn)
	if err != nil {
		return "", err
	}
	defer c.Close(bg)
	return fn(c)
}

func main() {
	fmt.Println("VERSION 4.15.0 (Debian golang-github-jackc-pgx-v4-dev)")
	caps := os.Getenv("SANDPIT_CAPS") == "1"

	step("connect_scram", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			var u string
			if err := c.QueryRow(bg, "select current_user").Scan(&u); err != nil {
				return "", err
			}
			return "SCRAM-SHA-256", want("user", u, "agent")
		})
	})
	step("connect_tls_cleartext", func() (string, error) {
		// The gateway refuses cleartext without TLS from loopback: this login used TLS.
		c, err := connect(clear)
		if err != nil {
			return "", err
		}
		defer c.Close(bg)
		var s string
		if err := c.QueryRow(bg, "select 'in'").Scan(&s); err != nil {
			return "", err
		}
		return "sslmode=require", want("select", s, "in")
	})
	fmt.Println("STEP channel_binding skip pgx v4 (pgconn 1.x) has no channel binding (no SCRAM-SHA-256-PLUS)")

	step("create_table", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			_, err := c.Exec(bg, "create table scenario(id int primary key, name text not null)")
			return "", err
		})
	})
	step("insert_params", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			if _, err := c.Exec(bg, "insert into scenario values ($1, $2)", 1, "one"); err != nil {
				return "", err
			}
			var name string
			if err := c.QueryRow(bg, "select name from scenario where id = $1", 1).Scan(&name); err != nil {
				return "", err
			}
			return "", want("row", name, "one")
		})
	})
	step("prepared_reuse", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			if _, err := c.Prepare(bg, "ins", "insert into scenario values ($1, $2)"); err != nil {
				return "", err
			}
			for i := 2; i <= 4; i++ {
				if _, err := c.Exec(bg, "ins", i, fmt.Sprintf("n%d", i)); err != nil {
					return "", err
				}
			}
			n, err := count(c, "select count(*) from pg_prepared_statements")
			if err != nil {
				return "", err
			}
			if n < 1 {
				return "", errors.New("no prepared statement on the server")
			}
			got, err := count(c, "select count(*) from scenario where id between 2 and 4")
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%d server-side prepared", n), want("count", got, int64(3))
		})
	})
	step("transaction_rollback", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			tx, err := c.Begin(bg)
			if err != nil {
				return "", err
			}
			if _, err := tx.Exec(bg, "insert into scenario values (100, 'gone')"); err != nil {
				return "", err
			}
			if err := tx.Rollback(bg); err != nil {
				return "", err
			}
			n, err := count(c, "select count(*) from scenario where id = 100")
			if err != nil {
				return "", err
			}
			return "", want("count", n, int64(0))
		})
	})
	step("savepoint", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			tx, err := c.Begin(bg)
			if err != nil {
				return "", err
			}
			defer tx.Rollback(bg)
			if _, err := tx.Exec(bg, "insert into scenario values (200, 'kept')"); err != nil {
				return "", err
			}
			inner, err := tx.Begin(bg) // nested: a SAVEPOINT
			if err != nil {
				return "", err
			}
			if _, err := inner.Exec(bg, "insert into scenario values (201, 'undone')"); err != nil {
				return "", err
			}
			_, err = inner.Exec(bg, "insert into scenario values (200, 'dup')")
			if sqlState(err) != "23505" {
				return "", fmt.Errorf("want a unique violation, got %v", err)
			}
			if err := inner.Rollback(bg); err != nil {
				return "", err
			}
			if err := tx.Commit(bg); err != nil {
				return "", err
			}
			rows, err := c.Query(bg, "select id from scenario where id >= 200 order by id")
			if err != nil {
				return "", err
			}
			var ids []int32
			for rows.Next() {
				var id int32
				if err := rows.Scan(&id); err != nil {
					return "", err
				}
				ids = append(ids, id)
			}
			if rows.Err() != nil {
				return "", rows.Err()
			}
			return "", want("ids", ids, []int32{200})
		})
	})
	step("copy_in", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			var rows [][]interface{}
			for i := 1000; i < 2000; i++ {
				rows = append(rows, []interface{}{int32(i), fmt.Sprintf("copied %d", i)})
			}
			n, err := c.CopyFrom(bg, pgx.Identifier{"scenario"}, []string{"id", "name"}, pgx.CopyFromRows(rows))
			if err != nil {
				return "", err
			}
			if err := want("copied", n, int64(1000)); err != nil {
				return "", err
			}
			got, err := count(c, "select count(*) from scenario where name like 'copied %'")
			if err != nil {
				return "", err
			}
			return "CopyFrom (binary COPY)", want("count", got, int64(1000))
		})
	})
	step("copy_out", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			var buf bytes.Buffer
			tag, err := c.PgConn().CopyTo(bg, &buf, "copy (select id, name from scenario where id between 1000 and 1999 order by id) to stdout")
			if err != nil {
				return "", err
			}
			if err := want("copied", tag.RowsAffected(), int64(1000)); err != nil {
				return "", err
			}
			lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
			if err := want("rows", len(lines), 1000); err != nil {
				return "", err
			}
			return "PgConn().CopyTo", want("first", lines[0], "1000\tcopied 1000")
		})
	})
	step("listen_notify", func() (string, error) {
		a, err := connect(dsn)
		if err != nil {
			return "", err
		}
		defer a.Close(bg)
		return with(func(b *pgx.Conn) (string, error) {
			if _, err := a.Exec(bg, "listen scenario_ch"); err != nil {
				return "", err
			}
			if _, err := b.Exec(bg, "notify scenario_ch, 'hello from B'"); err != nil {
				return "", err
			}
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			n, err := a.WaitForNotification(ctx)
			if err != nil {
				return "", err
			}
			return "WaitForNotification", want("notification", []string{n.Channel, n.Payload}, []string{"scenario_ch", "hello from B"})
		})
	})
	step("cancel", func() (string, error) {
		c, err := connect(dsn)
		if err != nil {
			return "", err
		}
		defer c.Close(bg)
		return with(func(watcher *pgx.Conn) (string, error) {
			var wg sync.WaitGroup
			var problem error
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					n, err := count(watcher, "select count(*) from pg_stat_activity where state = 'active' and query like '%pgx cancel%' and pid <> pg_backend_pid()")
					if err != nil {
						problem = err
						return
					}
					if n > 0 {
						ctx, cancel := context.WithTimeout(bg, 10*time.Second)
						defer cancel()
						problem = c.PgConn().CancelRequest(ctx)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				problem = errors.New("the statement never became active")
			}()
			start := time.Now()
			_, err := c.Exec(bg, "select pg_sleep(30) /* pgx cancel */")
			wg.Wait()
			if problem != nil {
				return "", fmt.Errorf("CancelRequest: %w", problem)
			}
			if time.Since(start) > 25*time.Second {
				return "", errors.New("cancel took too long")
			}
			if err := want("sqlstate", sqlState(err), "57014"); err != nil {
				return "", err
			}
			n, err := count(c, "select 7")
			if err != nil {
				return "", err
			}
			return "PgConn().CancelRequest, SQLSTATE 57014", want("after cancel", n, int64(7))
		})
	})
	step("unique_violation", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			_, err := c.Exec(bg, "insert into scenario values ($1, $2)", 1, "dup")
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				return "", fmt.Errorf("want a PgError, got %v", err)
			}
			if err := want("sqlstate", pe.Code, "23505"); err != nil {
				return "", err
			}
			return "PgError, SQLSTATE 23505", want("constraint", pe.ConstraintName, "scenario_pkey")
		})
	})
	step("types_roundtrip", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			if _, err := c.Exec(bg, "create table types(n numeric, j jsonb, ts timestamptz, b bytea, a int[], t text[])"); err != nil {
				return "", err
			}
			n := "12345678901234567890.000000012345"
			j := map[string]interface{}{"k": []interface{}{1.0, 2.5, "x"}, "n": nil}
			ts := time.Date(2024, 2, 29, 23, 59, 59, 123456000, time.UTC)
			b := make([]byte, 256)
			for i := range b {
				b[i] = byte(i)
			}
			var num pgtype.Numeric
			if err := num.Set(n); err != nil {
				return "", err
			}
			arr := pgtype.Int4Array{}
			if err := arr.Set([]pgtype.Int4{{Int: 1, Status: pgtype.Present}, {Int: 2, Status: pgtype.Present}, {Status: pgtype.Null}, {Int: 4, Status: pgtype.Present}}); err != nil {
				return "", err
			}
			texts := []string{"a b", "c,d", ""}
			if _, err := c.Exec(bg, "insert into types values ($1, $2, $3, $4, $5, $6)", &num, j, ts, b, &arr, texts); err != nil {
				return "", err
			}
			var gotN pgtype.Numeric
			var gotJ map[string]interface{}
			var gotTs time.Time
			var gotB []byte
			var gotA pgtype.Int4Array
			var gotT []string
			if err := c.QueryRow(bg, "select n, j, ts, b, a, t from types").Scan(&gotN, &gotJ, &gotTs, &gotB, &gotA, &gotT); err != nil {
				return "", err
			}
			// Compared as pgtype spells them (digits and exponent): every digit kept.
			text, err := gotN.EncodeText(nil, nil)
			if err != nil {
				return "", err
			}
			sent, err := num.EncodeText(nil, nil)
			if err != nil {
				return "", err
			}
			for _, e := range []error{
				want("numeric", string(text), string(sent)),
				want("numeric digits", gotN.Int.String()+"e"+fmt.Sprint(gotN.Exp), "12345678901234567890000000012345e-12"),
				want("jsonb", mustJSON(gotJ), mustJSON(j)),
				want("timestamptz", gotTs.UTC(), ts),
				want("bytea", gotB, b),
				want("int[]", len(gotA.Elements) == 4 && gotA.Elements[0].Int == 1 && gotA.Elements[2].Status == pgtype.Null && gotA.Elements[3].Int == 4, true),
				want("text[]", gotT, texts),
			} {
				if e != nil {
					return "", e
				}
			}
			return "binary results", nil
		})
	})
	step("cursor", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			tx, err := c.Begin(bg)
			if err != nil {
				return "", err
			}
			defer tx.Rollback(bg)
			if _, err := tx.Exec(bg, "declare scenario_cur cursor for select g from generate_series(1, 1000) g"); err != nil {
				return "", err
			}
			var got []int32
			for {
				rows, err := tx.Query(bg, "fetch 150 from scenario_cur")
				if err != nil {
					return "", err
				}
				n := 0
				for rows.Next() {
					var g int32
					if err := rows.Scan(&g); err != nil {
						return "", err
					}
					got = append(got, g)
					n++
				}
				if rows.Err() != nil {
					return "", rows.Err()
				}
				if n == 0 {
					break
				}
			}
			if err := want("rows", len(got), 1000); err != nil {
				return "", err
			}
			return "DECLARE, FETCH 150 at a time", want("last", got[999], int32(1000))
		})
	})
	step("pgx_batch", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			b := &pgx.Batch{}
			for i := 3000; i < 3100; i++ {
				b.Queue("insert into scenario values ($1, 'batched') returning id", i)
			}
			b.Queue("select count(*) from scenario where name = 'batched'")
			br := c.SendBatch(bg, b)
			for i := 3000; i < 3100; i++ {
				var id int32
				if err := br.QueryRow().Scan(&id); err != nil {
					br.Close()
					return "", err
				}
				if err := want("returned id", id, int32(i)); err != nil {
					br.Close()
					return "", err
				}
			}
			var n int64
			if err := br.QueryRow().Scan(&n); err != nil {
				br.Close()
				return "", err
			}
			if err := br.Close(); err != nil {
				return "", err
			}
			if err := want("count in the same batch", n, int64(100)); err != nil {
				return "", err
			}
			// An error inside a batch arrives with its SQLSTATE and the rest is skipped.
			b = &pgx.Batch{}
			b.Queue("insert into scenario values (3000, 'dup')")
			b.Queue("select 1")
			br = c.SendBatch(bg, b)
			_, err := br.Exec()
			br.Close()
			if err := want("sqlstate", sqlState(err), "23505"); err != nil {
				return "", err
			}
			got, err := count(c, "select count(*) from scenario where name = 'batched'")
			if err != nil {
				return "", err
			}
			return "SendBatch of 101 statements, one Sync", want("count", got, int64(100))
		})
	})
	step("notify_backend_pid", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			pid := c.PgConn().PID()
			got, err := count(c, "select pg_backend_pid()")
			if err != nil {
				return "", err
			}
			if err := want("pg_backend_pid()", got, int64(pid)); err != nil {
				return "", err
			}
			if _, err := c.Exec(bg, "listen own_ch"); err != nil {
				return "", err
			}
			if _, err := c.Exec(bg, "notify own_ch, 'mine'"); err != nil {
				return "", err
			}
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			n, err := c.WaitForNotification(ctx)
			if err != nil {
				return "", err
			}
			return "Notification.PID == PgConn().PID()", want("notification", fmt.Sprintf("%s/%s/%d", n.Channel, n.Payload, n.PID), fmt.Sprintf("own_ch/mine/%d", pid))
		})
	})
	step("terminate_self", func() (string, error) {
		c, err := connect(dsn)
		if err != nil {
			return "", err
		}
		defer c.Close(bg)
		_, err = c.Exec(bg, fmt.Sprintf("select pg_terminate_backend(%d)", c.PgConn().PID()))
		if err := want("sqlstate", sqlState(err), "57P01"); err != nil {
			return "", err
		}
		return "pg_terminate_backend(PgConn().PID()) returns PgError 57P01, connection closed", want("closed", c.IsClosed(), true)
	})
	twoPhase()
	step("write_returning_uncapped", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			if _, err := c.Exec(bg, "create table returning_scenario(id serial primary key, g int)"); err != nil {
				return "", err
			}
			for _, q := range []string{
				"insert into returning_scenario(g) select g from generate_series(1, 500) g returning id",
				"update returning_scenario set g = -g returning id",
			} {
				rows, err := c.Query(bg, q)
				if err != nil {
					return "", err
				}
				n := 0
				for rows.Next() {
					n++
				}
				if rows.Err() != nil {
					return "", rows.Err()
				}
				if err := want("rows returned by "+q[:6], n, 500); err != nil {
					return "", err
				}
			}
			return "INSERT/UPDATE … RETURNING of 500 rows under max_rows 200", nil
		})
	})
	step("catalog_uncapped", func() (string, error) {
		return with(func(c *pgx.Conn) (string, error) {
			n, err := count(c, "select count(*) from pg_catalog.pg_type")
			if err != nil {
				return "", err
			}
			if n <= 200 {
				return "", fmt.Errorf("pg_type has only %d rows: the step needs more than 200", n)
			}
			rows, err := c.Query(bg, "select oid, typname from pg_catalog.pg_type")
			if err != nil {
				return "", err
			}
			var got int64
			for rows.Next() {
				got++
			}
			if rows.Err() != nil {
				return "", rows.Err()
			}
			return fmt.Sprintf("all %d rows of pg_type under max_rows 200", n), want("pg_type rows", got, n)
		})
	})
	if caps {
		step("capped_select", func() (string, error) {
			cfg, err := pgx.ParseConfig(dsn)
			if err != nil {
				return "", err
			}
			var notices []string
			cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
			c, err := pgx.ConnectConfig(bg, cfg)
			if err != nil {
				return "", err
			}
			defer c.Close(bg)
			rows, err := c.Query(bg, "select * from generate_series(1, 100000)")
			if err != nil {
				return "", err
			}
			n := 0
			for rows.Next() {
				n++
			}
			if rows.Err() != nil {
				return "", rows.Err()
			}
			if err := want("rows", n, 200); err != nil {
				return "", err
			}
			if len(notices) == 0 {
				return "", errors.New("no NOTICE")
			}
			return notices[0], nil
		})
	} else {
		fmt.Println("STEP capped_select skip SANDPIT_CAPS is not 1")
	}
	if failed {
		os.Exit(1)
	}
}

func mustJSON(v interface{}) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// twoPhase runs the two-phase step, or says why it is skipped (the server's setting).
func twoPhase() {
	c, err := connect(dsn)
	if err != nil {
		step("two_phase", func() (string, error) { return "", err })
		return
	}
	defer c.Close(bg)
	var mpt string
	if err := c.QueryRow(bg, "show max_prepared_transactions").Scan(&mpt); err != nil {
		step("two_phase", func() (string, error) { return "", err })
		return
	}
	if mpt == "0" {
		fmt.Println("STEP two_phase skip max_prepared_transactions is 0 on this server")
		return
	}
	step("two_phase", func() (string, error) {
		// pgx has no two-phase API: the SQL spelling, committed then rolled back.
		for _, q := range []string{
			"create table tpc_scenario(id int)",
			"begin", "insert into tpc_scenario values (1)", "prepare transaction 'sandpit-pgx-1'",
		} {
			if _, err := c.Exec(bg, q); err != nil {
				return "", err
			}
		}
		n, err := count(c, "select count(*) from pg_prepared_xacts where gid = 'sandpit-pgx-1'")
		if err != nil {
			return "", err
		}
		if err := want("prepared", n, int64(1)); err != nil {
			return "", err
		}
		for _, q := range []string{
			"commit prepared 'sandpit-pgx-1'",
			"begin", "insert into tpc_scenario values (2)", "prepare transaction 'sandpit-pgx-2'",
			"rollback prepared 'sandpit-pgx-2'",
		} {
			if _, err := c.Exec(bg, q); err != nil {
				return "", err
			}
		}
		rows, err := count(c, "select count(*) from tpc_scenario")
		if err != nil {
			return "", err
		}
		if err := want("rows", rows, int64(1)); err != nil {
			return "", err
		}
		left, err := count(c, "select count(*) from pg_prepared_xacts")
		if err != nil {
			return "", err
		}
		return "PREPARE TRANSACTION / COMMIT PREPARED / ROLLBACK PREPARED (max_prepared_transactions = " + mpt + ")", want("left prepared", left, int64(0))
	})
}

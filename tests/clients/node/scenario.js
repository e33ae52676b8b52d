// The client scenario with node-postgres (pg), through the gateway.
// In: SANDPIT_DSN (from `token issue`), SANDPIT_DSN_CLEARTEXT (agent / <id>.<secret>,
// sslmode=require), SANDPIT_CAPS=1 to run the capped SELECT too.
// Out: one `STEP <name> ok|fail|skip <detail>` line per step; exit 1 if any failed.
'use strict'

const { pipeline } = require('node:stream/promises')
const { Readable } = require('node:stream')
const assert = require('node:assert/strict')
const pg = require('pg')
const Cursor = require('pg-cursor')
const { from: copyFrom, to: copyTo } = require('pg-copy-streams')

const DSN = process.env.SANDPIT_DSN
// node-postgres reads sslmode=require as verify-full unless asked for libpq's meaning.
const CLEAR = process.env.SANDPIT_DSN_CLEARTEXT.replace('sslmode=require', 'uselibpqcompat=true&sslmode=require')
let failed = false
// A step returning SKIP + why is reported as skipped (the matrix says why).
const SKIP = '\u0000skip:'

async function step(name, fn) {
  try {
    const detail = (await fn()) || ''
    if (detail.startsWith(SKIP)) console.log(`STEP ${name} skip ${detail.slice(SKIP.length)}`)
    else console.log(`STEP ${name} ok ${detail}`)
  } catch (e) {
    failed = true
    console.log(`STEP ${name} fail ${String(e && e.stack ? e.message : e).replace(/\n/g, ' ').slice(0, 600)}`)
  }
}

async function connect(config = {}) {
  const c = new pg.Client({ connectionString: DSN, ...config })
  await c.connect()
  return c
}

async function withClient(fn, config) {
  const c = await connect(config)
  try {
    return await fn(c)
  } finally {
    await c.end()
  }
}

const one = async (c, text, values) => (await c.query(text, values)).rows[0]

async function main() {
  console.log(`VERSION ${require('pg/package.json').version}`)

  await step('connect_scram', () =>
    withClient(async (c) => {
      assert.equal((await one(c, 'select current_user as u')).u, 'agent')
    })
  )

  await step('connect_tls_cleartext', async () => {
    const c = new pg.Client({ connectionString: CLEAR })
    await c.connect()
    try {
      assert.ok(c.connection.stream.encrypted, 'not on TLS')
      assert.equal((await one(c, "select 'in' as x")).x, 'in')
    } finally {
      await c.end()
    }
  })

  await step('channel_binding', async () => {
    const c = new pg.Client({
      connectionString: DSN + '?uselibpqcompat=true&sslmode=require',
      enableChannelBinding: true,
    })
    let mechanism = null
    const send = c.connection.sendSASLInitialResponseMessage.bind(c.connection)
    c.connection.sendSASLInitialResponseMessage = (mech, resp) => {
      mechanism = mech
      send(mech, resp)
    }
    await c.connect()
    try {
      assert.equal(mechanism, 'SCRAM-SHA-256-PLUS')
      assert.equal((await one(c, 'select 1 as x')).x, 1)
    } finally {
      await c.end()
    }
    return 'enableChannelBinding, SCRAM-SHA-256-PLUS'
  })

  await step('create_table', () =>
    withClient(async (c) => {
      await c.query('create table scenario(id int primary key, name text not null)')
    })
  )

  await step('insert_params', () =>
    withClient(async (c) => {
      await c.query('insert into scenario values ($1, $2)', [1, 'one'])
      assert.equal((await one(c, 'select name from scenario where id = $1', [1])).name, 'one')
    })
  )

  await step('prepared_reuse', () =>
    withClient(async (c) => {
      for (const i of [2, 3, 4]) {
        // A named query is parsed once per connection and then only bound and executed.
        await c.query({ name: 'ins', text: 'insert into scenario values ($1, $2)', values: [i, `n${i}`] })
      }
      // The server holds it once, under the gateway's own name (the client's never reaches
      // the backend: src/proxy/pipeline/owned.rs).
      const p = await one(c, "select count(*)::int as n from pg_prepared_statements where statement = 'insert into scenario values ($1, $2)' and not from_sql and name <> 'ins' and name like 'sp%'")
      assert.equal(p.n, 1)
      assert.equal((await one(c, 'select count(*)::int as n from scenario where id between 2 and 4')).n, 3)
      return 'named statement "ins"'
    })
  )

  await step('transaction_rollback', () =>
    withClient(async (c) => {
      await c.query('begin')
      await c.query("insert into scenario values (100, 'gone')")
      await c.query('rollback')
      assert.equal((await one(c, 'select count(*)::int as n from scenario where id = 100')).n, 0)
    })
  )

  await step('savepoint', () =>
    withClient(async (c) => {
      await c.query('begin')
      await c.query("insert into scenario values (200, 'kept')")
      await c.query('savepoint s')
      await c.query("insert into scenario values (201, 'undone')")
      await c.query('rollback to savepoint s')
      await c.query('commit')
      const r = await c.query('select id from scenario where id >= 200 order by id')
      assert.deepEqual(
        r.rows.map((x) => x.id),
        [200]
      )
    })
  )

  await step('copy_in', () =>
    withClient(async (c) => {
      const lines = []
      for (let i = 1000; i < 2000; i++) lines.push(`${i}\tcopied ${i}\n`)
      await pipeline(Readable.from(lines), c.query(copyFrom('copy scenario (id, name) from stdin')))
      assert.equal((await one(c, "select count(*)::int as n from scenario where name like 'copied %'")).n, 1000)
    })
  )

  await step('copy_out', () =>
    withClient(async (c) => {
      const chunks = []
      const out = c.query(copyTo('copy (select id, name from scenario where id between 1000 and 1999 order by id) to stdout'))
      for await (const chunk of out) chunks.push(chunk)
      const lines = Buffer.concat(chunks).toString().trimEnd().split('\n')
      assert.equal(lines.length, 1000)
      assert.equal(lines[0], '1000\tcopied 1000')
    })
  )

  await step('listen_notify', async () => {
    const a = await connect()
    const b = await connect()
    try {
      await a.query('listen scenario_ch')
      const got = new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error('no notification in 10 s')), 10000)
        a.on('notification', (m) => {
          clearTimeout(t)
          resolve(m)
        })
      })
      await b.query("notify scenario_ch, 'hello from B'")
      const m = await got
      assert.equal(m.channel, 'scenario_ch')
      assert.equal(m.payload, 'hello from B')
    } finally {
      await a.end()
      await b.end()
    }
  })

  await step('cancel', async () => {
    const c = await connect()
    const watcher = await connect()
    try {
      const q = c.query(new pg.Query('select pg_sleep(30) /* to cancel */'))
      const done = new Promise((resolve) => {
        q.on('error', (e) => resolve(e))
        q.on('end', () => resolve(null))
      })
      const start = Date.now()
      let seen = false
      for (let i = 0; i < 200 && !seen; i++) {
        const r = await one(
          watcher,
          "select count(*)::int as n from pg_stat_activity where state = 'active' and query like '%to cancel%' and pid <> pg_backend_pid()"
        )
        seen = r.n > 0
        if (!seen) await new Promise((r) => setTimeout(r, 50))
      }
      assert.ok(seen, 'the statement never became active')
      // node-postgres' cancel: a second Client sends a CancelRequest with the first one's key.
      new pg.Client({ connectionString: DSN }).cancel(c, q)
      const err = await done
      assert.ok(err, 'pg_sleep(30) was not cancelled')
      assert.equal(err.code, '57014')
      assert.ok(Date.now() - start < 25000, 'cancel took too long')
    } finally {
      await c.end()
      await watcher.end()
    }
    return 'Client.cancel(), SQLSTATE 57014'
  })

  await step('unique_violation', () =>
    withClient(async (c) => {
      const err = await c.query('insert into scenario values ($1, $2)', [1, 'dup']).then(
        () => null,
        (e) => e
      )
      assert.ok(err, 'no error')
      assert.equal(err.code, '23505')
      assert.equal(err.constraint, 'scenario_pkey')
      return 'SQLSTATE 23505'
    })
  )

  await step('types_roundtrip', () =>
    withClient(async (c) => {
      // NUMERIC comes back as a string (exact); timestamptz as a Date (milliseconds).
      const n = '12345678901234567890.000000012345'
      const j = { k: [1, 2.5, 'x'], n: null }
      const ts = new Date('2024-02-29T23:59:59.123Z')
      const b = Buffer.from([...Array(256).keys()])
      const a = [1, 2, null, 4]
      const t = ['a b', 'c,d', '']
      await c.query('create table types(n numeric, j jsonb, ts timestamptz, b bytea, a int[], t text[])')
      await c.query('insert into types values ($1, $2, $3, $4, $5, $6)', [n, j, ts, b, a, t])
      const r = await one(c, 'select n, j, ts, b, a, t from types')
      assert.equal(r.n, n)
      assert.deepEqual(r.j, j)
      assert.equal(r.ts.getTime(), ts.getTime())
      assert.ok(b.equals(r.b), 'bytea differs')
      assert.deepEqual(r.a, a)
      assert.deepEqual(r.t, t)
    })
  )

  await step('cursor', () =>
    withClient(async (c) => {
      const cur = c.query(new Cursor('select g from generate_series(1, 1000) g'))
      const got = []
      for (;;) {
        const rows = await cur.read(150)
        if (rows.length === 0) break
        got.push(...rows.map((r) => r.g))
      }
      await cur.close()
      assert.equal(got.length, 1000)
      assert.equal(got[999], 1000)
      return 'pg-cursor, read(150)'
    })
  )

  await step('notify_backend_pid', () =>
    withClient(async (c) => {
      assert.equal((await one(c, 'select pg_backend_pid() as p')).p, c.processID)
      await c.query('listen own_ch')
      const got = new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error('no notification in 10 s')), 10000)
        c.on('notification', (m) => {
          clearTimeout(t)
          resolve(m)
        })
      })
      await c.query("notify own_ch, 'mine'")
      const m = await got
      assert.equal(m.payload, 'mine')
      assert.equal(m.processId, c.processID)
      return 'notification.processId == client.processID'
    })
  )

  await step('terminate_self', async () => {
    const c = await connect()
    // The FATAL also reaches the client's 'error' event; the query's rejection is what counts.
    c.on('error', () => {})
    const err = await c.query('select pg_terminate_backend($1)', [c.processID]).then(
      () => null,
      (e) => e
    )
    assert.ok(err, 'no error')
    assert.equal(err.code, '57P01')
    await c.end().catch(() => {})
    return 'pg_terminate_backend(client.processID) rejects with 57P01'
  })

  await step('two_phase', () =>
    withClient(async (c) => {
      const mpt = Number((await one(c, 'show max_prepared_transactions')).max_prepared_transactions)
      if (mpt === 0) return SKIP + 'max_prepared_transactions is 0 on this server'
      await c.query('create table tpc_node(id int)')
      await c.query('begin')
      await c.query('insert into tpc_node values (1)')
      await c.query("prepare transaction 'sandpit-node'")
      assert.equal((await one(c, 'select count(*)::int as n from pg_prepared_xacts')).n, 1)
      await c.query("commit prepared 'sandpit-node'")
      assert.equal((await one(c, 'select count(*)::int as n from tpc_node')).n, 1)
      assert.equal((await one(c, 'select count(*)::int as n from pg_prepared_xacts')).n, 0)
      return `PREPARE TRANSACTION / COMMIT PREPARED (max_prepared_transactions = ${mpt})`
    })
  )

  if (process.env.SANDPIT_CAPS === '1') {
    await step('capped_select', () =>
      withClient(async (c) => {
        const notices = []
        c.on('notice', (n) => notices.push(n.message))
        const r = await c.query('select * from generate_series(1, 100000)')
        assert.equal(r.rows.length, 200)
        assert.ok(notices.length > 0, 'no NOTICE')
        return notices[0]
      })
    )
  } else {
    console.log('STEP capped_select skip SANDPIT_CAPS is not 1')
  }
}

main()
  .catch((e) => {
    failed = true
    console.log(`STEP scenario fail ${e}`)
  })
  .finally(() => process.exit(failed ? 1 : 0))

// postgres.js (npm `postgres`) through the gateway: the steps where it differs from
// node-postgres. It reads every array type from pg_type on each new connection, so a user
// enum's array decodes as an array only if that catalog query came back whole.
// In: SANDPIT_DSN. Out: `STEP <name> ok|fail|skip <detail>` lines; exit 1 if any failed.
'use strict'

const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const postgres = require('postgres')

const DSN = process.env.SANDPIT_DSN
let failed = false

async function step(name, fn) {
  try {
    const detail = (await fn()) || ''
    console.log(`STEP ${name} ok ${detail}`)
  } catch (e) {
    failed = true
    console.log(`STEP ${name} fail ${String(e && e.message ? e.message : e).replace(/\n/g, ' ').slice(0, 600)}`)
  }
}

// The query postgres.js runs at connect (src/connection.js fetchArrayTypes), counted.
const ARRAY_TYPES = `select count(*)::int as n from (
  select b.oid, b.typarray from pg_catalog.pg_type a
  left join pg_catalog.pg_type b on b.oid = a.typelem
  where a.typcategory = 'A' group by b.oid, b.typarray) t`

async function main() {
  // The package does not export its package.json: read it from the file.
  const pkg = JSON.parse(fs.readFileSync(path.join(path.dirname(require.resolve('postgres')), '..', '..', 'package.json')))
  console.log(`VERSION ${pkg.version}`)

  await step('connect_scram', async () => {
    const sql = postgres(DSN, { max: 1, onnotice: () => {} })
    try {
      const [r] = await sql`select current_user as u`
      assert.equal(r.u, 'agent')
    } finally {
      await sql.end()
    }
  })

  await step('enum_array_fresh', async () => {
    const setup = postgres(DSN, { max: 1, onnotice: () => {} })
    let n
    try {
      // Enough user types that the connect-time query returns more than 200 rows, with
      // the enum under test last (highest oid, so the end of that query's ORDER BY).
      n = (await setup.unsafe(ARRAY_TYPES))[0].n
      const fill = []
      for (let i = 0; n + i <= 220; i++) fill.push(`create type pgjs_fill_${i} as enum ('x');`)
      if (fill.length) await setup.unsafe(fill.join('\n'))
      await setup.unsafe("create type mood as enum ('sad', 'ok', 'happy')")
      await setup.unsafe('create table moods(id int primary key, m mood[])')
      await setup.unsafe("insert into moods values (1, '{sad,happy}')")
      n = (await setup.unsafe(ARRAY_TYPES))[0].n
      assert.ok(n > 200, `only ${n} array types`)
    } finally {
      await setup.end()
    }
    // A fresh connection reads pg_type again, now with mood[] among more than 200 rows.
    const sql = postgres(DSN, { max: 1, onnotice: () => {} })
    try {
      const [stored] = await sql`select m from moods where id = 1`
      assert.deepEqual(stored.m, ['sad', 'happy'])
      const [lit] = await sql`select ${'{ok,sad}'}::mood[] as m`
      assert.deepEqual(lit.m, ['ok', 'sad'])
      await sql`insert into moods values (2, ${'{happy,ok}'}::mood[])`
      const [back] = await sql`select m from moods where id = 2`
      assert.deepEqual(back.m, ['happy', 'ok'])
    } finally {
      await sql.end()
    }
    return `mood[] decodes as an array with ${n} array types in pg_type`
  })

  await step('terminate_self', async () => {
    const sql = postgres(DSN, { max: 1, onnotice: () => {} })
    const codes = []
    let back = false
    try {
      const [{ pid }] = await sql`select pg_backend_pid() as pid`
      const err = await sql`select pg_terminate_backend(${pid})`.then(
        () => null,
        (e) => e
      )
      assert.ok(err, 'no error')
      codes.push(err.code)
      // postgres.js 3.4.9 may reject the terminating query with CONNECTION_CLOSED and hand
      // the server's FATAL (57P01) to the next query; it does the same against a stock
      // PostgreSQL 15. Then it reconnects.
      for (let i = 0; i < 3 && !back; i++) {
        const r = await sql`select 1 as n`.then(
          (rows) => rows,
          (e) => e
        )
        if (!Array.isArray(r)) codes.push(r.code)
        else if (r.length === 1) back = r[0].n === 1
        else codes.push(`${r.length} rows`)
      }
    } finally {
      await sql.end({ timeout: 5 }).catch(() => {})
    }
    assert.ok(codes.includes('57P01'), `no 57P01 among ${codes.join(', ')}`)
    assert.ok(back, 'never reconnected')
    return `errors ${codes.join(' then ')}, then a new connection`
  })
}

main()
  .catch((e) => {
    failed = true
    console.log(`STEP scenario fail ${e}`)
  })
  .finally(() => process.exit(failed ? 1 : 0))

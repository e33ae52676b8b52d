//! The promotion corpus: realistic agent sessions over a small shop database (the golden
//! masks `customers.email`), each with what must happen — promoted exactly, or refused
//! before approval with a reason containing the given words. Run by `runner.rs`.

/// The source database the golden is built from (and each target copied from).
/// `page_views` is written concurrently on the target during every promotion; no session
/// touches it.
pub const SOURCE_SQL: &str = "
CREATE TABLE customers(id int PRIMARY KEY, email text NOT NULL, name text NOT NULL, city text);
CREATE TABLE products(id serial PRIMARY KEY, sku text NOT NULL, name text NOT NULL,
  price numeric(10,2) NOT NULL, stock int NOT NULL DEFAULT 0);
CREATE TABLE orders(id serial PRIMARY KEY, customer_id int NOT NULL REFERENCES customers(id),
  status text NOT NULL, total numeric(10,2) NOT NULL, created date NOT NULL);
CREATE TABLE order_items(order_id int NOT NULL REFERENCES orders(id),
  product_id int NOT NULL REFERENCES products(id), qty int NOT NULL CHECK (qty > 0),
  PRIMARY KEY (order_id, product_id));
CREATE TABLE tags(name text NOT NULL);
CREATE TABLE legacy_imports(id int PRIMARY KEY, payload text NOT NULL);
CREATE TABLE settings(key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE page_views(id bigserial PRIMARY KEY, path text NOT NULL, hits int NOT NULL DEFAULT 0);
CREATE VIEW open_orders AS SELECT id, customer_id, total FROM orders WHERE status = 'open';
INSERT INTO customers SELECT g, 'cust' || g || '@real.test', 'Customer ' || g,
  CASE WHEN g % 7 = 0 THEN NULL ELSE 'city-' || (g % 5) END FROM generate_series(1, 40) g;
-- skus repeat: products 21..30 duplicate 1..10
INSERT INTO products(sku, name, price, stock)
  SELECT 'SKU-' || ((g - 1) % 20 + 1), 'Product ' || g, (g * 3.25)::numeric(10,2), g % 9
  FROM generate_series(1, 30) g;
INSERT INTO orders(customer_id, status, total, created)
  SELECT 1 + g % 40, CASE WHEN g % 3 = 0 THEN 'shipped' ELSE 'open' END, g * 1.5,
    date '2024-01-01' + g FROM generate_series(1, 120) g;
-- each order holds one product of 1..10 or 21..30 (never both twins of a sku)
INSERT INTO order_items SELECT g, CASE WHEN g % 2 = 0 THEN 1 + g % 10 ELSE 21 + g % 10 END, 1 + g % 4
  FROM generate_series(1, 120) g;
INSERT INTO tags VALUES ('new'), ('sale'), ('sale'), ('old'), ('old'), ('old');
INSERT INTO legacy_imports SELECT g, 'row ' || g FROM generate_series(1, 25) g;
INSERT INTO settings VALUES ('currency', 'EUR'), ('vat', '25');
INSERT INTO page_views(path) VALUES ('/');
";

/// What must become of a session.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// Approved and promoted exactly.
    Promoted,
    /// Refused before approval; the reason contains these words.
    Refused(&'static str),
}

/// One agent session.
pub struct Session {
    /// Its task name.
    pub name: &'static str,
    /// What the agent ran (also run directly on the expected copy).
    pub sql: &'static str,
    /// What must happen.
    pub expect: Expect,
    /// A concurrent edit that conflicts with the change: run first on another copy of
    /// the source, where the promotion must list conflicts and apply nothing.
    pub conflict: Option<&'static str>,
}

use Expect::*;

/// The sessions.
pub const SESSIONS: &[Session] = &[
    Session {
        name: "dedupe-products",
        sql: "
UPDATE order_items oi SET product_id = m.keep
  FROM (SELECT id, min(id) OVER (PARTITION BY sku) AS keep FROM products) m
  WHERE oi.product_id = m.id AND m.id <> m.keep;
DELETE FROM products p USING products q WHERE p.sku = q.sku AND p.id > q.id;
ALTER TABLE products ADD CONSTRAINT products_sku_key UNIQUE (sku);",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "backfill-item-count",
        sql: "
ALTER TABLE orders ADD COLUMN item_count int;
UPDATE orders o SET item_count = (SELECT coalesce(sum(qty), 0) FROM order_items WHERE order_id = o.id);
ALTER TABLE orders ALTER COLUMN item_count SET NOT NULL;",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "rename-column",
        sql: "ALTER TABLE customers RENAME COLUMN city TO town;
UPDATE customers SET town = 'unknown' WHERE town IS NULL;",
        expect: Promoted,
        conflict: Some("UPDATE customers SET city = 'Moss' WHERE id = 7"),
    },
    Session {
        name: "rename-table",
        sql: "ALTER TABLE legacy_imports RENAME TO imports_archive;
DELETE FROM imports_archive WHERE id > 20;",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "widen-stock-type",
        sql: "ALTER TABLE products ALTER COLUMN stock TYPE bigint;
UPDATE products SET stock = stock + 100 WHERE id <= 3;",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "price-precision",
        sql: "ALTER TABLE products ALTER COLUMN price TYPE numeric(12,3);
UPDATE products SET price = price * 1.125 WHERE id IN (1, 2);",
        expect: Promoted,
        conflict: Some("UPDATE products SET price = 9.99 WHERE id = 2"),
    },
    Session {
        name: "report-view",
        sql: "CREATE VIEW customer_totals AS
  SELECT customer_id, count(*) AS orders, sum(total) AS spent FROM orders GROUP BY customer_id;
COMMENT ON VIEW customer_totals IS 'Spend per customer';",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "replace-view",
        sql: "CREATE OR REPLACE VIEW open_orders AS
  SELECT id, customer_id, total, created FROM orders WHERE status = 'open';",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "helper-function",
        sql: "CREATE FUNCTION order_value(o int) RETURNS numeric LANGUAGE sql STABLE
  AS 'SELECT total FROM orders WHERE id = o';",
        expect: Refused("a function: its body is agent code"),
        conflict: None,
    },
    Session {
        name: "audit-trigger",
        sql: "CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql
  AS 'BEGIN NEW.status := lower(NEW.status); RETURN NEW; END';
CREATE TRIGGER orders_stamp BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION stamp();
UPDATE orders SET status = 'OPEN' WHERE id = 1;",
        expect: Refused("a trigger runs its function"),
        conflict: None,
    },
    Session {
        name: "keyless-tags-cleanup",
        sql: "DELETE FROM tags WHERE ctid IN (SELECT ctid FROM tags WHERE name = 'old' LIMIT 2);
INSERT INTO tags VALUES ('clearance');",
        expect: Promoted,
        conflict: Some("INSERT INTO tags VALUES ('old')"),
    },
    Session {
        name: "merge-customer",
        sql: "UPDATE orders SET customer_id = 3 WHERE customer_id = 2;
DELETE FROM customers WHERE id = 2;",
        expect: Promoted,
        conflict: Some("INSERT INTO orders(customer_id, status, total, created) VALUES (2, 'open', 1, '2024-01-01')"),
    },
    Session {
        name: "coupons-serial-table",
        sql: "CREATE TABLE coupons(id serial PRIMARY KEY, code text NOT NULL UNIQUE,
  pct int NOT NULL CHECK (pct BETWEEN 1 AND 90));
INSERT INTO coupons(code, pct) VALUES ('WELCOME', 10), ('VIP', 25), ('SPRING', 15);",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "drop-legacy-table",
        sql: "DROP TABLE legacy_imports;",
        expect: Promoted,
        conflict: Some("INSERT INTO legacy_imports VALUES (99, 'late')"),
    },
    Session {
        name: "copy-email-to-status",
        sql: "UPDATE orders o SET status = c.email FROM customers c WHERE c.id = o.customer_id AND o.id = 7;",
        expect: Refused("writes values the golden's masking produced"),
        conflict: None,
    },
    Session {
        name: "mailing-list-table",
        sql: "CREATE TABLE mailing AS SELECT id, lower(email) AS address FROM customers WHERE city IS NOT NULL;",
        expect: Refused("writes values the golden's masking produced"),
        conflict: None,
    },
    Session {
        name: "docs-and-grants",
        sql: "COMMENT ON TABLE orders IS 'One row per checkout';
COMMENT ON COLUMN orders.status IS 'open or shipped';
GRANT SELECT ON products TO PUBLIC;",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "row-security",
        sql: "ALTER TABLE orders ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_orders ON orders USING (customer_id = 1);",
        expect: Refused("does not model"),
        conflict: None,
    },
    Session {
        name: "city-not-null-and-index",
        sql: "UPDATE customers SET city = 'unknown' WHERE city IS NULL;
ALTER TABLE customers ALTER COLUMN city SET NOT NULL;
CREATE INDEX orders_created_idx ON orders (created);",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "notify-default",
        sql: "ALTER TABLE settings ADD COLUMN changed text DEFAULT pg_notify('x', 'y')::text;",
        expect: Refused("which has side effects"),
        conflict: None,
    },
    Session {
        name: "new-orders-with-items",
        sql: "INSERT INTO orders(customer_id, status, total, created) VALUES (5, 'open', 42.00, '2024-06-01');
INSERT INTO order_items VALUES (currval('orders_id_seq'), 4, 2);
UPDATE products SET stock = stock - 2 WHERE id = 4;",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "settings-upsert-and-default",
        sql: "INSERT INTO settings VALUES ('vat', '24'), ('locale', 'nb_NO')
  ON CONFLICT (key) DO UPDATE SET value = excluded.value;
ALTER TABLE products ALTER COLUMN stock SET DEFAULT 10;",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "reporting-schema",
        sql: "CREATE SCHEMA reporting;
CREATE VIEW reporting.daily_sales AS SELECT created, sum(total) AS total FROM public.orders GROUP BY created;",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "drop-column-and-fk",
        sql: "ALTER TABLE order_items DROP CONSTRAINT order_items_product_id_fkey;
ALTER TABLE customers DROP COLUMN city;",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "new-customer-signup",
        sql: "INSERT INTO customers VALUES (41, 'new@real.test', 'New Person', 'Oslo');",
        expect: Refused("inserted rows carry values for masked columns"),
        conflict: None,
    },
    Session {
        name: "notify-view",
        sql: "CREATE VIEW order_pings AS SELECT id, pg_notify('orders', id::text)::text AS sent FROM orders;",
        expect: Refused("which has side effects"),
        conflict: None,
    },
    Session {
        name: "rename-constraint-and-seq",
        sql: "ALTER TABLE order_items RENAME CONSTRAINT order_items_qty_check TO qty_positive;
ALTER SEQUENCE products_id_seq RENAME TO products_seq;
INSERT INTO products(sku, name, price) VALUES ('SKU-NEW', 'New thing', 5.00);",
        expect: Promoted,
        conflict: None,
    },
    Session {
        name: "move-settings-schema",
        sql: "CREATE SCHEMA config;
ALTER TABLE settings SET SCHEMA config;
UPDATE config.settings SET value = 'NOK' WHERE key = 'currency';",
        expect: Promoted,
        conflict: Some("UPDATE settings SET value = 'USD' WHERE key = 'currency'"),
    },
    Session {
        name: "rename-view",
        sql: "ALTER VIEW open_orders RENAME TO orders_open;
COMMENT ON VIEW orders_open IS 'Orders not shipped yet';",
        expect: Promoted,
        conflict: None,
    },
];

-- sandpit demo golden: a small shop. Fully deterministic (multiplicative hashing, no random()),
-- so every build yields the same rows. Tables are created and filled in one transaction before
-- keys and indexes exist: with wal_level=minimal the load skips WAL and index builds are bulk.
-- h(x) = (x * 2654435761) % 4294967296 is Knuth's multiplicative hash.
BEGIN;

CREATE TABLE customers (
    id         integer     NOT NULL,
    name       text        NOT NULL,
    email      text        NOT NULL,
    country    text        NOT NULL,
    created_at timestamptz NOT NULL
);
INSERT INTO customers
SELECT i,
       (ARRAY['Ada','Grace','Alan','Edsger','Barbara','Donald','Ken','Margaret','Linus','Frances',
              'Niklaus','Radia','John','Sophie','Dennis','Hedy'])[1 + (h / 7) % 16] || ' ' ||
       (ARRAY['Lovelace','Hopper','Turing','Dijkstra','Liskov','Knuth','Thompson','Hamilton',
              'Torvalds','Allen','Wirth','Perlman','Backus','Wilson','Ritchie','Lamarr'])[1 + (h / 131) % 16],
       'customer' || i || '@example.' || (ARRAY['com','org','net'])[1 + (h / 3) % 3],
       (ARRAY['US','DE','FR','GB','JP','BR','IN','NL','SE','CA'])[1 + (h / 1009) % 10],
       timestamptz '2022-01-01 00:00:00+00' + (h % 31536000) * interval '1 second'
FROM generate_series(1, 10000) AS i,
     LATERAL (SELECT (i::bigint * 2654435761) % 4294967296 AS h) AS x;

CREATE TABLE products (
    id    integer       NOT NULL,
    sku   text          NOT NULL,
    name  text          NOT NULL,
    price numeric(10,2) NOT NULL
);
INSERT INTO products
SELECT i,
       'SKU-' || lpad(i::text, 5, '0'),
       (ARRAY['Small','Large','Red','Blue','Steel','Wooden','Organic','Deluxe','Compact','Vintage'])[1 + (h / 11) % 10] || ' ' ||
       (ARRAY['Mug','Lamp','Chair','Notebook','Kettle','Backpack','Pen','Clock','Plant','Towel'])[1 + (h / 97) % 10],
       round(1.99 + (h % 49800) / 100.0, 2)
FROM generate_series(1, 1000) AS i,
     LATERAL (SELECT (i::bigint * 2654435761) % 4294967296 AS h) AS x;

-- 1 to 4 lines per order (about 250k lines for 100k orders).
CREATE TABLE order_items (
    order_id   integer       NOT NULL,
    line_no    integer       NOT NULL,
    product_id integer       NOT NULL,
    quantity   integer       NOT NULL,
    unit_price numeric(10,2) NOT NULL
);
INSERT INTO order_items
SELECT o, l, p.id, 1 + (hl / 17) % 5, p.price
FROM generate_series(1, 100000) AS o,
     LATERAL (SELECT (o::bigint * 2654435761) % 4294967296 AS h) AS x,
     LATERAL generate_series(1, 1 + (x.h / 5) % 4) AS l,
     LATERAL (SELECT ((o::bigint * 8 + l) * 2246822519) % 4294967296 AS hl) AS y
     JOIN products p ON p.id = 1 + (y.hl / 3) % 1000;

-- Status mix: pending 20%, paid 40%, shipped 30%, cancelled 5%, refunded 5%.
CREATE TABLE orders (
    id          integer       NOT NULL,
    customer_id integer       NOT NULL,
    status      text          NOT NULL,
    total       numeric(12,2) NOT NULL,
    created_at  timestamptz   NOT NULL
);
INSERT INTO orders
SELECT t.order_id,
       1 + (h / 13) % 10000,
       CASE WHEN (h / 7) % 100 < 20 THEN 'pending'
            WHEN (h / 7) % 100 < 60 THEN 'paid'
            WHEN (h / 7) % 100 < 90 THEN 'shipped'
            WHEN (h / 7) % 100 < 95 THEN 'cancelled'
            ELSE 'refunded' END,
       t.total,
       timestamptz '2023-01-01 00:00:00+00' + t.order_id * interval '5 minutes' + (h % 300) * interval '1 second'
FROM (SELECT order_id, sum(quantity * unit_price) AS total FROM order_items GROUP BY order_id) AS t,
     LATERAL (SELECT (t.order_id::bigint * 2654435761) % 4294967296 AS h) AS x;

CREATE TABLE refunds (
    id         integer       NOT NULL,
    order_id   integer       NOT NULL,
    amount     numeric(12,2) NOT NULL,
    reason     text          NOT NULL,
    created_at timestamptz   NOT NULL
);
INSERT INTO refunds
SELECT row_number() OVER (ORDER BY o.id),
       o.id,
       CASE WHEN (h / 3) % 4 = 0 THEN round(o.total / 2, 2) ELSE o.total END,
       (ARRAY['damaged','late delivery','wrong item','changed mind','duplicate order'])[1 + (h / 29) % 5],
       o.created_at + (1 + h % 20) * interval '1 day'
FROM orders o,
     LATERAL (SELECT (o.id::bigint * 40503) % 65536 AS h) AS x
WHERE o.status = 'refunded';

ALTER TABLE customers   ADD PRIMARY KEY (id), ADD UNIQUE (email);
ALTER TABLE products    ADD PRIMARY KEY (id), ADD UNIQUE (sku),
                        ADD CHECK (price >= 0);
ALTER TABLE orders      ADD PRIMARY KEY (id),
                        ADD FOREIGN KEY (customer_id) REFERENCES customers (id),
                        ADD CHECK (status IN ('pending','paid','shipped','cancelled','refunded'));
ALTER TABLE order_items ADD PRIMARY KEY (order_id, line_no),
                        ADD FOREIGN KEY (order_id) REFERENCES orders (id) ON DELETE CASCADE,
                        ADD FOREIGN KEY (product_id) REFERENCES products (id),
                        ADD CHECK (quantity > 0);
ALTER TABLE refunds     ADD PRIMARY KEY (id),
                        ADD FOREIGN KEY (order_id) REFERENCES orders (id) ON DELETE CASCADE;

CREATE INDEX orders_customer_id_idx ON orders (customer_id);
CREATE INDEX orders_status_created_at_idx ON orders (status, created_at);
CREATE INDEX order_items_product_id_idx ON order_items (product_id);
CREATE INDEX refunds_order_id_idx ON refunds (order_id);

-- Sequences so an agent can insert rows the usual way.
CREATE SEQUENCE customers_id_seq OWNED BY customers.id;
CREATE SEQUENCE products_id_seq OWNED BY products.id;
CREATE SEQUENCE orders_id_seq OWNED BY orders.id;
CREATE SEQUENCE refunds_id_seq OWNED BY refunds.id;
ALTER TABLE customers ALTER COLUMN id SET DEFAULT nextval('customers_id_seq');
ALTER TABLE products  ALTER COLUMN id SET DEFAULT nextval('products_id_seq');
ALTER TABLE orders    ALTER COLUMN id SET DEFAULT nextval('orders_id_seq');
ALTER TABLE refunds   ALTER COLUMN id SET DEFAULT nextval('refunds_id_seq');
SELECT setval('customers_id_seq', 10000), setval('products_id_seq', 1000),
       setval('orders_id_seq', (SELECT max(id) FROM orders)),
       setval('refunds_id_seq', greatest((SELECT max(id) FROM refunds), 1));

COMMIT;

//! The session generator of `tests/review/review_property.rs`: a small deterministic PRNG and a
//! model of one schema copy (`s<slot>`: parent, child → parent, tag → parent, a sequence),
//! so that every generated statement succeeds on the database it describes.

use std::collections::{BTreeMap, BTreeSet};

/// Operation kinds the generator draws from. The ones marked (*) are the five review gaps of
/// issue 16 (sequence renames, foreign keys re-pointed, values of added columns, comments and
/// grants, dropped tables' rows).
pub const KINDS: &[&str] = &[
    "insert",
    "update",
    "delete",
    "key",             // primary-key changes
    "repoint",         // (*) children moved between parents, old parent deleted
    "rename_table",    //
    "rename_column",   //
    "rename_sequence", // (*)
    "add_column",      // (*) added column, backfilled, sometimes SET NOT NULL
    "drop_column",     //
    "comment",         // (*)
    "grant",           // (*)
    "sequence",        // nextval / setval
    "drop_table",      // (*)
    "create_table",    // a new table with a foreign key and rows
    "rollback",        // work rolled back
];

/// splitmix64: small, deterministic, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.below(v.len())])
        }
    }
}

/// A column the generator may write: name, integer (else text), NOT NULL.
#[derive(Clone)]
struct Col {
    name: String,
    int: bool,
    not_null: bool,
}

#[derive(Clone)]
struct Table {
    name: String,
    cols: Vec<Col>,
}

/// What the generator believes the session's schema holds.
struct Model {
    s: String,
    parent: Table,
    child: Table,
    tag: Option<Table>,
    parents: BTreeSet<i32>,
    children: BTreeMap<i32, i32>,
    tags: Vec<(i32, String)>,
    next_parent: i32,
    next_key: i32,
    /// Next value the child id serial hands out.
    child_seq_next: i64,
    child_seq: String,
    ticket: String,
    n: u32,
    /// Parents rows of created tables point at: never deleted or re-keyed.
    pinned: BTreeSet<i32>,
}

fn col(name: &str, int: bool, not_null: bool) -> Col {
    Col {
        name: name.into(),
        int,
        not_null,
    }
}

impl Model {
    fn new(slot: usize) -> Model {
        Model {
            s: format!("s{slot}"),
            parent: Table {
                name: "parent".into(),
                cols: vec![col("name", false, true), col("score", true, false)],
            },
            child: Table {
                name: "child".into(),
                cols: vec![col("qty", true, true), col("note", false, false)],
            },
            tag: Some(Table {
                name: "tag".into(),
                cols: vec![col("label", false, false)],
            }),
            parents: (1..=6).collect(),
            children: (1..=12).map(|g| (g, 1 + (g % 6))).collect(),
            tags: (1..=8).map(|g| (1 + (g % 6), format!("t{g}"))).collect(),
            next_parent: 100,
            next_key: 1000,
            child_seq_next: 13,
            child_seq: "child_id_seq".into(),
            ticket: "ticket".into(),
            n: 0,
            pinned: BTreeSet::new(),
        }
    }
    fn q(&self, name: &str) -> String {
        format!("{}.{name}", self.s)
    }
    fn fresh(&mut self, base: &str) -> String {
        self.n += 1;
        format!("{base}_{}", self.n)
    }
}

/// A value for a column: integers, and text with quotes, backslashes and non-ASCII.
fn value(r: &mut Rng, c: &Col) -> String {
    if c.int {
        (r.below(2000) as i64 - 500).to_string()
    } else {
        let pieces = ["v", "it''s", "back\\slash", "ü", "  ", "x;y", "--z"];
        let mut s = String::new();
        for _ in 0..1 + r.below(3) {
            s.push_str(pieces[r.below(pieces.len())]);
        }
        if !c.not_null && r.chance(15) {
            "NULL".into()
        } else {
            format!("'{s}{}'", r.below(100))
        }
    }
}

fn assignments(r: &mut Rng, t: &Table) -> Option<String> {
    let c = r.pick(&t.cols)?.clone();
    Some(format!("{} = {}", c.name, value(r, &c)))
}

fn insert_row(r: &mut Rng, m: &Model, t: &Table, lead: &[(&str, String)]) -> String {
    let mut names: Vec<String> = lead.iter().map(|(n, _)| n.to_string()).collect();
    let mut vals: Vec<String> = lead.iter().map(|(_, v)| v.clone()).collect();
    for c in &t.cols {
        if c.not_null || r.chance(70) {
            names.push(c.name.clone());
            vals.push(value(r, c));
        }
    }
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        m.q(&t.name),
        names.join(", "),
        vals.join(", ")
    )
}

/// One operation of kind `kind`, as statements; None when the model has nothing to do it on.
fn op(r: &mut Rng, m: &mut Model, kind: &str) -> Option<Vec<String>> {
    let parents: Vec<i32> = m.parents.iter().copied().collect();
    let movable: Vec<i32> = parents
        .iter()
        .copied()
        .filter(|p| !m.pinned.contains(p))
        .collect();
    let children: Vec<i32> = m.children.keys().copied().collect();
    let referenced = |m: &Model, p: i32| {
        m.children.values().any(|x| *x == p) || m.tags.iter().any(|(x, _)| *x == p)
    };
    Some(match kind {
        "insert" => match r.below(3) {
            0 => {
                let id = m.next_parent;
                m.next_parent += 1;
                m.parents.insert(id);
                let t = m.parent.clone();
                vec![insert_row(r, m, &t, &[("id", id.to_string())])]
            }
            1 => {
                let p = *r.pick(&parents)?;
                let id = m.child_seq_next;
                m.child_seq_next += 1;
                m.children.insert(id as i32, p);
                let t = m.child.clone();
                vec![insert_row(r, m, &t, &[("parent_id", p.to_string())])]
            }
            _ => {
                let t = m.tag.clone()?;
                let p = *r.pick(&parents)?;
                let label = format!("new{}", r.below(1000));
                m.tags.push((p, label.clone()));
                vec![format!(
                    "INSERT INTO {} (parent_id) VALUES ({p})",
                    m.q(&t.name)
                )]
            }
        },
        "update" => match r.below(3) {
            0 => {
                let id = *r.pick(&parents)?;
                let set = assignments(r, &m.parent)?;
                vec![format!(
                    "UPDATE {} SET {set} WHERE id = {id}",
                    m.q(&m.parent.name)
                )]
            }
            1 => {
                let set = assignments(r, &m.child)?;
                if r.chance(30) {
                    // Several rows at once.
                    vec![format!(
                        "UPDATE {} SET {set} WHERE id % 3 = {}",
                        m.q(&m.child.name),
                        r.below(3)
                    )]
                } else {
                    let id = *r.pick(&children)?;
                    vec![format!(
                        "UPDATE {} SET {set} WHERE id = {id}",
                        m.q(&m.child.name)
                    )]
                }
            }
            _ => {
                let t = m.tag.clone()?;
                let set = assignments(r, &t)?;
                let p = *r.pick(&parents)?;
                vec![format!(
                    "UPDATE {} SET {set} WHERE parent_id = {p}",
                    m.q(&t.name)
                )]
            }
        },
        "delete" => match r.below(3) {
            0 => {
                let id = *r.pick(&children)?;
                m.children.remove(&id);
                vec![format!(
                    "DELETE FROM {} WHERE id = {id}",
                    m.q(&m.child.name)
                )]
            }
            1 => {
                let t = m.tag.clone()?;
                let p = *r.pick(&parents)?;
                m.tags.retain(|(x, _)| *x != p);
                vec![format!(
                    "DELETE FROM {} WHERE parent_id = {p}",
                    m.q(&t.name)
                )]
            }
            _ => {
                // A parent with its children and tags, children first.
                let p = *r.pick(&movable)?;
                let mut out = vec![format!(
                    "DELETE FROM {} WHERE parent_id = {p}",
                    m.q(&m.child.name)
                )];
                if let Some(t) = &m.tag {
                    out.push(format!(
                        "DELETE FROM {} WHERE parent_id = {p}",
                        m.q(&t.name)
                    ));
                }
                out.push(format!(
                    "DELETE FROM {} WHERE id = {p}",
                    m.q(&m.parent.name)
                ));
                m.children.retain(|_, x| *x != p);
                m.tags.retain(|(x, _)| *x != p);
                m.parents.remove(&p);
                out
            }
        },
        "key" => {
            if r.chance(50) {
                let id = *r.pick(&children)?;
                let new = m.next_key;
                m.next_key += 1;
                let p = m.children.remove(&id)?;
                m.children.insert(new, p);
                vec![format!(
                    "UPDATE {} SET id = {new} WHERE id = {id}",
                    m.q(&m.child.name)
                )]
            } else {
                let free: Vec<i32> = movable
                    .iter()
                    .copied()
                    .filter(|p| !referenced(m, *p))
                    .collect();
                let id = *r.pick(&free)?;
                let new = m.next_key;
                m.next_key += 1;
                m.parents.remove(&id);
                m.parents.insert(new);
                vec![format!(
                    "UPDATE {} SET id = {new} WHERE id = {id}",
                    m.q(&m.parent.name)
                )]
            }
        }
        "repoint" => {
            if r.chance(50) {
                let id = *r.pick(&children)?;
                let p = *r.pick(&parents)?;
                m.children.insert(id, p);
                vec![format!(
                    "UPDATE {} SET parent_id = {p} WHERE id = {id}",
                    m.q(&m.child.name)
                )]
            } else {
                // A new parent takes over an old one's children, and the old one goes.
                let old = *r.pick(&movable)?;
                let new = m.next_parent;
                m.next_parent += 1;
                let t = m.parent.clone();
                let mut out = vec![insert_row(r, m, &t, &[("id", new.to_string())])];
                out.push(format!(
                    "UPDATE {} SET parent_id = {new} WHERE parent_id = {old}",
                    m.q(&m.child.name)
                ));
                if let Some(t) = &m.tag {
                    out.push(format!(
                        "UPDATE {} SET parent_id = {new} WHERE parent_id = {old}",
                        m.q(&t.name)
                    ));
                }
                out.push(format!(
                    "DELETE FROM {} WHERE id = {old}",
                    m.q(&m.parent.name)
                ));
                for x in m.children.values_mut() {
                    if *x == old {
                        *x = new;
                    }
                }
                for (x, _) in m.tags.iter_mut() {
                    if *x == old {
                        *x = new;
                    }
                }
                m.parents.remove(&old);
                m.parents.insert(new);
                out
            }
        }
        "rename_table" => {
            let which = r.below(3);
            let base = match which {
                0 => "parent",
                1 => "child",
                _ => "tag",
            };
            let new = m.fresh(base);
            let t = match which {
                0 => &mut m.parent,
                1 => &mut m.child,
                _ => m.tag.as_mut()?,
            };
            let old = std::mem::replace(&mut t.name, new.clone());
            vec![format!("ALTER TABLE {}.{old} RENAME TO {new}", m.s)]
        }
        "rename_column" => {
            let which = r.below(3);
            let t = match which {
                0 => m.parent.clone(),
                1 => m.child.clone(),
                _ => m.tag.clone()?,
            };
            let i = r.below(t.cols.len());
            let old = t.cols.get(i)?.name.clone();
            let new = m.fresh(old.split('_').next().unwrap_or("c"));
            let tm = match which {
                0 => &mut m.parent,
                1 => &mut m.child,
                _ => m.tag.as_mut()?,
            };
            tm.cols[i].name = new.clone();
            vec![format!(
                "ALTER TABLE {}.{} RENAME COLUMN {old} TO {new}",
                m.s, t.name
            )]
        }
        "rename_sequence" => {
            if r.chance(60) {
                let new = m.fresh("child_ids");
                let old = std::mem::replace(&mut m.child_seq, new.clone());
                vec![format!("ALTER SEQUENCE {}.{old} RENAME TO {new}", m.s)]
            } else {
                let new = m.fresh("ticket");
                let old = std::mem::replace(&mut m.ticket, new.clone());
                vec![format!("ALTER SEQUENCE {}.{old} RENAME TO {new}", m.s)]
            }
        }
        "add_column" => {
            let name = m.fresh("extra");
            let on_parent = r.chance(50);
            let t = if on_parent { &m.parent } else { &m.child };
            let tq = m.q(&t.name);
            let mut out = vec![format!("ALTER TABLE {tq} ADD COLUMN {name} int")];
            let not_null = r.chance(40);
            // Backfilled by the agent, every row or some.
            if not_null || r.chance(60) {
                out.push(format!("UPDATE {tq} SET {name} = id * 7 + {}", r.below(5)));
            } else {
                out.push(format!("UPDATE {tq} SET {name} = id WHERE id % 2 = 0"));
            }
            if not_null {
                out.push(format!("ALTER TABLE {tq} ALTER COLUMN {name} SET NOT NULL"));
            }
            let t = if on_parent {
                &mut m.parent
            } else {
                &mut m.child
            };
            t.cols.push(col(&name, true, not_null));
            out
        }
        "drop_column" => {
            let on_parent = r.chance(50);
            let t = if on_parent {
                &mut m.parent
            } else {
                &mut m.child
            };
            if t.cols.is_empty() {
                return None;
            }
            let i = r.below(t.cols.len());
            let c = t.cols.remove(i);
            vec![format!(
                "ALTER TABLE {}.{} DROP COLUMN {}",
                m.s, t.name, c.name
            )]
        }
        "comment" => {
            let text = format!("'note {} it''s'", r.below(100));
            match r.below(4) {
                0 => vec![format!(
                    "COMMENT ON TABLE {} IS {text}",
                    m.q(&m.parent.name)
                )],
                1 => {
                    let c = r.pick(&m.child.cols)?.name.clone();
                    vec![format!(
                        "COMMENT ON COLUMN {}.{c} IS {text}",
                        m.q(&m.child.name)
                    )]
                }
                2 => vec![format!("COMMENT ON SEQUENCE {} IS {text}", m.q(&m.ticket))],
                _ => vec![format!("COMMENT ON SCHEMA {} IS {text}", m.s)],
            }
        }
        "grant" => {
            let t = if r.chance(50) {
                m.parent.name.clone()
            } else {
                m.child.name.clone()
            };
            match r.below(4) {
                0 => vec![format!("GRANT SELECT ON {} TO agent_read", m.q(&t))],
                1 => vec![format!(
                    "GRANT SELECT, UPDATE ON {} TO agent_write",
                    m.q(&t)
                )],
                2 => vec![format!("REVOKE ALL ON {} FROM agent_read", m.q(&t))],
                _ => {
                    let c = r.pick(&m.parent.cols)?.name.clone();
                    vec![format!(
                        "GRANT UPDATE ({c}) ON {} TO agent_write",
                        m.q(&m.parent.name)
                    )]
                }
            }
        }
        "sequence" => {
            if r.chance(60) {
                vec![format!("SELECT nextval('{}')", m.q(&m.ticket))]
            } else {
                vec![format!(
                    "SELECT setval('{}', {}, {})",
                    m.q(&m.ticket),
                    1 + r.below(500),
                    r.chance(50)
                )]
            }
        }
        "drop_table" => {
            let t = m.tag.take()?;
            m.tags.clear();
            vec![format!("DROP TABLE {}", m.q(&t.name))]
        }
        "create_table" => {
            let name = m.fresh("extra_t");
            let tq = m.q(&name);
            let p = *r.pick(&parents)?;
            m.pinned.insert(p);
            vec![
                format!(
                    "CREATE TABLE {tq} (id int PRIMARY KEY, parent_id int REFERENCES {}(id), v text)",
                    m.q(&m.parent.name)
                ),
                format!(
                    "INSERT INTO {tq} SELECT g, {p}, 'row ' || g FROM generate_series(1, {}) g",
                    1 + r.below(20)
                ),
            ]
        }
        "rollback" => {
            // Work that is rolled back: changes nothing but the serial it consumed.
            let id = *r.pick(&parents)?;
            let set = assignments(r, &m.parent)?;
            let p = *r.pick(&parents)?;
            m.child_seq_next += 1;
            let t = m.child.clone();
            let ins = insert_row(r, m, &t, &[("parent_id", p.to_string())]);
            vec![
                "BEGIN".into(),
                format!("UPDATE {} SET {set} WHERE id = {id}", m.q(&m.parent.name)),
                ins,
                "ROLLBACK".into(),
            ]
        }
        _ => return None,
    })
}

/// The statements of the session `seed`, in schema `s{slot}`, with the kinds in `on`.
pub fn session(seed: u64, slot: usize, on: &[&str]) -> Vec<String> {
    let mut r = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED);
    let mut m = Model::new(slot);
    let mut out = Vec::new();
    let ops = 3 + r.below(10);
    let mut tries = 0;
    while out.len() < ops && tries < ops * 10 {
        tries += 1;
        let Some(kind) = r.pick(on).copied() else {
            break;
        };
        if let Some(stmts) = op(&mut r, &mut m, kind) {
            out.extend(stmts);
        }
    }
    out
}

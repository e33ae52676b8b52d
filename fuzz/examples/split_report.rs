//! Runs the `split_differential` comparison over its seed corpus and seeded mutations of it
//! on the stable toolchain, and prints how often each verdict came up, with every text on
//! which the gateway's splitter found fewer statements than the Postgres grammar.
//!
//! `cargo run --example split_report [iterations]` from `fuzz/`.

use std::collections::BTreeMap;

use sandpit_fuzz::differential::{compare, Verdict};

/// xorshift64*: enough randomness for mutations, no extra dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Pieces that change how SQL lexes.
const PIECES: &[&str] = &[
    "'",
    "\"",
    ";",
    "--",
    "\r",
    "\n",
    "/*",
    "*/",
    "$",
    "$a$",
    "E'",
    "e'",
    "\\",
    "U&'",
    "x'",
    "BEGIN ATOMIC",
    " ",
    "\x0b",
    "\x0c",
    "é",
    "namE",
    "''",
    "$1",
    "SELECT 1",
    "::text",
];

fn mutate(rng: &mut Rng, seeds: &[String]) -> String {
    let mut s = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let at = {
            let mut i = rng.below(s.len() + 1);
            while !s.is_char_boundary(i) {
                i -= 1;
            }
            i
        };
        match rng.below(4) {
            0 => s.insert_str(at, PIECES[rng.below(PIECES.len())]),
            1 => {
                let other = &seeds[rng.below(seeds.len())];
                s.insert_str(at, other);
            }
            2 if at < s.len() => {
                let mut end = (at + 1 + rng.below(8)).min(s.len());
                while !s.is_char_boundary(end) {
                    end += 1;
                }
                s.replace_range(at..end, "");
            }
            _ => s.insert_str(at, "; SELECT 2"),
        }
    }
    s
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/split_differential");
    let mut seeds: Vec<String> = std::fs::read_dir(&dir)
        .expect("seed corpus")
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .filter_map(|b| String::from_utf8(b).ok())
        .collect();
    seeds.sort();
    let mut rng = Rng(0x5a4d_7017_d1ff);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut fewer: BTreeMap<usize, String> = BTreeMap::new();
    // Same count, other boundaries: a few, shortest kept.
    let mut moved: Vec<String> = Vec::new();
    let inputs = seeds
        .clone()
        .into_iter()
        .chain((0..iters).map(|_| mutate(&mut rng, &seeds)));
    for text in inputs {
        let v = compare(&text);
        let name = format!("{v:?}");
        let name = name.split([' ', '{']).next().unwrap_or("").to_string();
        *counts.entry(name).or_default() += 1;
        if let Verdict::Boundaries { .. } = v {
            moved.push(text.clone());
        }
        if let Verdict::GatewayFewer { .. } = v {
            // Keep the shortest example per length bucket, to read them.
            fewer.entry(text.len() / 8).or_insert(text);
        }
    }
    for (k, n) in &counts {
        println!("{k}: {n}");
    }
    let mut shortest: Vec<&String> = fewer.values().collect();
    shortest.sort_by_key(|s| s.len());
    moved.sort_by_key(String::len);
    for t in moved.iter().take(5) {
        println!("same count, other boundaries: {t:?}");
    }
    for t in shortest.iter().take(40) {
        println!("gateway fewer: {t:?} -> {:?}", compare(t));
    }
}

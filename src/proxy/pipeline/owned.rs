//! Names the gateway gives the backend for the client's named statements and portals.
//!
//! The server forgets names in ways the gateway cannot follow without reading the client's
//! SQL (`DISCARD ALL`, `DEALLOCATE`, SQL `PREPARE` of a name the protocol also uses). So the
//! backend never sees a client's name: each client name maps (in [`super::names`], as part
//! of the value a name is bound to) to a name of the gateway's own, made of a per-session
//! random prefix and a counter that never repeats in the session. A mapping changes only when
//! the server answers (ParseComplete, BindComplete, CloseComplete):
//!
//! - a Parse (Bind) of a client name with a live mapping goes to that same backend name, so
//!   the server decides as it would for the client's own name: refused while it still holds
//!   it, accepted (and the mapping then holds the new text) once it forgot it;
//! - a Parse (Bind) of an unmapped client name gets a fresh backend name;
//! - any other use of an unmapped client name (Bind of its statement, Execute, Describe,
//!   Close) goes to a fresh name that was never defined, so the server itself answers that it
//!   does not exist, in its place in the pipeline; a statement the client made by SQL
//!   `PREPARE` under the same name is never reached through the protocol.
//!
//! One exception: a portal name the gateway has no mapping for, and that does not carry the
//! session's prefix, is passed on as the client's own. SQL `DECLARE` makes portals (cursors)
//! that drivers then describe and execute through the protocol (psycopg's server-side
//! cursors); such a cursor can only be a query, and its text is logged with the `DECLARE`.
//!
//! Another: a Query (or a Parse's text) that is only an SQL `DEALLOCATE` or `EXECUTE` of a
//! client's protocol statement, or a `FETCH`, `MOVE` or `CLOSE` of its protocol portal, is
//! sent with the backend name (`sql_names`); and errors naming a backend name are shown with
//! the client's (`shown_names`).
//!
//! The unnamed statement and portal stay unnamed (SQL cannot name them).

use std::collections::VecDeque;

use super::names::Lookup;

/// Longest backend name: "sp" + 8 hex + "_" + a letter + up to 20 digits.
const NAME_MAX: usize = 32;

/// What a backend name is for (its letter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// A statement the gateway parsed.
    Statement,
    /// A portal the gateway bound.
    Portal,
    /// A name never defined: the server answers that it does not exist.
    Missing,
    /// The client's own name (an unmapped portal: an SQL cursor), passed on as it is.
    Client,
}

/// The session's backend names: a prefix drawn at random per session (so a name cannot be
/// guessed before it is used) and a counter.
pub(super) struct BackendNames {
    prefix: [u8; 11],
    next: u64,
    /// The client names the latest never-defined backend names stood for, newest last (at
    /// most [`MISSING_KEPT`]): the server's "does not exist" error is shown with them.
    missing: VecDeque<(u64, Box<[u8]>)>,
}

/// Never-defined names remembered for the errors that name them (answered in order, so the
/// latest few suffice; a client that names more unknown names in one flight sees the
/// gateway's name in the older errors).
const MISSING_KEPT: usize = 16;

/// Longest client name shown in place of a backend name (in errors); a longer one is not
/// remembered, nor shown, so an agent's huge names cost neither memory here nor bytes in
/// every error that names them.
pub(super) const SHOWN_NAME_MAX: usize = 128;

/// A backend name, written on the stack (no allocation per message).
pub(super) struct NameBuf {
    buf: [u8; NAME_MAX],
    len: usize,
}

impl NameBuf {
    /// The name's bytes (no NUL).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Which backend name a client name resolves to (0: the unnamed one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Target(pub u64, pub Role);

impl BackendNames {
    /// A new session's names: a random prefix, the counter at 1.
    pub fn new() -> BackendNames {
        let r: [u8; 4] = rand::random();
        let mut prefix = *b"sp00000000_";
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for (i, b) in r.iter().enumerate() {
            prefix[2 + 2 * i] = HEX[usize::from(b >> 4)];
            prefix[3 + 2 * i] = HEX[usize::from(b & 15)];
        }
        BackendNames {
            prefix,
            next: 1,
            missing: VecDeque::new(),
        }
    }

    /// What every backend name of this session starts with.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The client name a never-defined backend name `id` stood for, while remembered.
    pub fn missing(&self, id: u64) -> Option<&[u8]> {
        let found = self.missing.iter().rev().find(|(n, _)| *n == id);
        found.map(|(_, name)| &name[..])
    }

    /// A number never handed out before in this session.
    pub fn fresh(&mut self) -> u64 {
        let n = self.next;
        self.next += 1;
        n
    }

    /// The backend name of `t` (empty for the unnamed entry).
    pub fn render(&self, t: Target) -> NameBuf {
        let mut out = NameBuf {
            buf: [0; NAME_MAX],
            len: 0,
        };
        if t.0 == 0 || t.1 == Role::Client {
            return out;
        }
        out.buf[..self.prefix.len()].copy_from_slice(&self.prefix);
        out.buf[self.prefix.len()] = match t.1 {
            Role::Statement => b's',
            Role::Portal => b'p',
            Role::Missing => b'x',
            Role::Client => b'c',
        };
        let mut digits = [0u8; 20];
        let mut n = t.0;
        let mut i = digits.len();
        while n > 0 {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        let start = self.prefix.len() + 1;
        let d = &digits[i..];
        out.buf[start..start + d.len()].copy_from_slice(d);
        out.len = start + d.len();
        out
    }

    /// For a Parse or Bind that defines the client name `name` (state `lookup`): the
    /// backend name it defines. The unnamed entry stays unnamed; a live mapping keeps its
    /// backend name (the server decides whether it still holds it); otherwise a fresh one.
    pub fn define<V>(
        &mut self,
        name: &[u8],
        lookup: &Lookup<'_, V>,
        backend_of: impl Fn(&V) -> u64,
        role: Role,
    ) -> Target {
        match lookup {
            _ if name.is_empty() => Target(0, role),
            Lookup::Defined(v) => Target(backend_of(v), role),
            _ => Target(self.fresh(), role),
        }
    }

    /// For a message that uses the client name `name` (Bind of a statement, Execute,
    /// Describe, Close): the backend name it uses. Unmapped: a name never defined.
    #[inline]
    pub fn refer<V>(
        &mut self,
        name: &[u8],
        lookup: &Lookup<'_, V>,
        backend_of: impl Fn(&V) -> u64,
        role: Role,
    ) -> Target {
        match lookup {
            _ if name.is_empty() => Target(0, role),
            Lookup::Defined(v) => Target(backend_of(v), role),
            _ if role == Role::Portal && !name.starts_with(&self.prefix[..2 + 8]) => {
                Target(0, Role::Client)
            }
            _ => Target(self.missing_for(name), Role::Missing),
        }
    }

    /// A fresh number for a never-defined name, remembered with the client's name (out of
    /// line: the error path, not the relay's).
    #[cold]
    #[inline(never)]
    fn missing_for(&mut self, name: &[u8]) -> u64 {
        let id = self.fresh();
        if name.len() > SHOWN_NAME_MAX {
            return id;
        }
        if self.missing.len() == MISSING_KEPT {
            self.missing.pop_front();
        }
        self.missing.push_back((id, name.into()));
        id
    }
}

/// The bytes a message carries for `t`: the backend name written in `buf`, or the client's
/// own `name` for [`Role::Client`].
pub(super) fn pick<'a>(t: Target, buf: &'a NameBuf, name: &'a [u8]) -> &'a [u8] {
    if t.1 == Role::Client {
        name
    } else {
        buf.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::names::Names;
    use super::*;

    /// A statement as far as the mapping goes: its text and backend number.
    #[derive(Clone, Debug, PartialEq)]
    struct V(&'static str, u64);

    impl super::super::names::Weight for V {
        fn weight(&self) -> usize {
            self.0.len()
        }
    }

    #[derive(Debug)]
    enum Step {
        /// Client Parse of a name in a group: which backend number it defines.
        Parse(&'static [u8], &'static str),
        /// The server answered the oldest pending change of the name.
        Ok(&'static [u8]),
        Err(&'static [u8]),
        /// Client Close.
        Close(&'static [u8]),
        /// A use (Bind/Execute/Describe): expected (text, backend number, role), or None
        /// for a never-defined name.
        Use(&'static [u8], Option<(&'static str, u64)>),
    }

    /// Runs a table: each step's expectation is checked on the way.
    fn run(steps: &[Step]) {
        use Step::*;
        let mut names = BackendNames::new();
        let mut m: Names<V> = Names::new();
        // Every step its own group (Sync after each): answers come before the next message.
        for (g, s) in steps.iter().enumerate() {
            let g = g as u64;
            match s {
                Parse(n, text) => {
                    let t = names.define(n, &m.lookup(n, g), |v| v.1, Role::Statement);
                    m.propose(n, Some(V(text, t.0)), g);
                }
                Ok(n) => drop(m.confirm(n)),
                Err(n) => m.discard(n),
                Close(n) => m.propose(n, None, g),
                Use(n, want) => {
                    let l = m.lookup(n, g);
                    let text = match &l {
                        Lookup::Defined(v) => Some(v.0),
                        _ => None,
                    };
                    let t = names.refer(n, &l, |v| v.1, Role::Statement);
                    match want {
                        Some((w, b)) => {
                            assert_eq!((text, t), (Some(*w), Target(*b, Role::Statement)), "{s:?}")
                        }
                        None => assert_eq!((text, t.1), (None, Role::Missing), "{s:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn a_mapping_changes_only_on_the_servers_answer() {
        use Step::*;
        // The example: after DISCARD ALL (invisible here) the server accepts a Parse
        // of the backend name again, and only then does the name hold the new text.
        run(&[
            Parse(b"s8", "SELECT 'harmless'"),
            Ok(b"s8"),
            Use(b"s8", Some(("SELECT 'harmless'", 1))),
            Parse(b"s8", "UPDATE t SET a = 1"),
            Ok(b"s8"),
            Use(b"s8", Some(("UPDATE t SET a = 1", 1))),
        ]);
        // The server still holds it: the second Parse is refused, the first text stays.
        run(&[
            Parse(b"s8", "SELECT 1"),
            Ok(b"s8"),
            Parse(b"s8", "UPDATE t SET a = 1"),
            Err(b"s8"),
            Use(b"s8", Some(("SELECT 1", 1))),
        ]);
        // A refused first Parse maps nothing: a use goes to a name never defined.
        run(&[Parse(b"a", "SELECT 1"), Err(b"a"), Use(b"a", None)]);
        // Closed: gone once the server answered; a new Parse gets a fresh backend name.
        run(&[
            Parse(b"a", "SELECT 1"),
            Ok(b"a"),
            Close(b"a"),
            Ok(b"a"),
            Use(b"a", None),
            Parse(b"a", "SELECT 2"),
            Ok(b"a"),
            Use(b"a", Some(("SELECT 2", 3))),
        ]);
        // Names never parsed (made by SQL PREPARE, say) are never passed through.
        run(&[Use(b"made_by_sql", None)]);
        // An unmapped portal (an SQL cursor) is passed on as it is, unless it carries the
        // session's prefix (a gateway portal another client name maps to).
        let mut names = BackendNames::new();
        let l: Lookup<'_, V> = Lookup::Undefined;
        let t = names.refer(b"cur", &l, |v| v.1, Role::Portal);
        assert_eq!(t.1, Role::Client);
        assert_eq!(pick(t, &names.render(t), b"cur"), b"cur");
        let ours = names.render(Target(1, Role::Portal));
        let t = names.refer(ours.as_bytes(), &l, |v| v.1, Role::Portal);
        assert_eq!(t.1, Role::Missing);
        assert_ne!(pick(t, &names.render(t), ours.as_bytes()), ours.as_bytes());
        // Statements are never passed through.
        let t = names.refer(b"cur", &l, |v| v.1, Role::Statement);
        assert_eq!(t.1, Role::Missing);
        // The unnamed statement stays unnamed.
        let mut names = BackendNames::new();
        let l: Lookup<'_, V> = Lookup::Undefined;
        assert_eq!(names.refer(b"", &l, |v| v.1, Role::Statement).0, 0);
        assert_eq!(names.define(b"", &l, |v| v.1, Role::Statement).0, 0);
    }

    #[test]
    fn backend_names_are_prefixed_counted_and_never_repeat() {
        let mut a = BackendNames::new();
        let b = BackendNames::new();
        let n1 = a.fresh();
        let n2 = a.fresh();
        assert_ne!(n1, n2);
        let s = a.render(Target(n1, Role::Statement));
        let p = a.render(Target(n2, Role::Portal));
        let x = a.render(Target(u64::MAX, Role::Missing));
        assert!(s.as_bytes().starts_with(&a.prefix) && s.as_bytes().ends_with(b"_s1"));
        assert!(p.as_bytes().ends_with(b"_p2"));
        assert!(x.as_bytes().ends_with(format!("_x{}", u64::MAX).as_bytes()));
        assert!(a.render(Target(0, Role::Statement)).as_bytes().is_empty());
        // Drawn per session (a clash of 32 random bits would be a 1 in 4e9 flake).
        assert_ne!(a.prefix, b.prefix);
    }

    #[test]
    fn never_defined_names_are_remembered_newest_first_and_bounded() {
        let mut names = BackendNames::new();
        let mut m: Names<V> = Names::new();
        let ids: Vec<u64> = (0..MISSING_KEPT + 4)
            .map(|i| {
                let n = format!("gone{i}");
                names
                    .refer(
                        n.as_bytes(),
                        &m.lookup(n.as_bytes(), 0),
                        |v| v.1,
                        Role::Statement,
                    )
                    .0
            })
            .collect();
        // The oldest four fell out; the rest map back to the client's names.
        for (i, id) in ids.iter().enumerate() {
            let want = (i >= 4).then(|| format!("gone{i}"));
            assert_eq!(
                names.missing(*id),
                want.as_deref().map(str::as_bytes),
                "{i}"
            );
        }
        // A defined name is not remembered as missing.
        let t = names.define(b"s", &m.lookup(b"s", 1), |v| v.1, Role::Statement);
        m.propose(b"s", Some(V("select 1", t.0)), 1);
        assert_eq!(names.missing(t.0), None);
        assert!(names.prefix().starts_with(b"sp") && names.prefix().ends_with(b"_"));
        // A name past SHOWN_NAME_MAX is not kept.
        let long = vec![b'n'; SHOWN_NAME_MAX + 1];
        let id = names
            .refer(&long, &m.lookup(&long, 2), |v| v.1, Role::Statement)
            .0;
        assert_eq!(names.missing(id), None);
    }
}

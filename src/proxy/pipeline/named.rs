//! Client messages that only name a statement or portal (Describe, Close, and a Bind whose
//! values cannot be read): each goes to the backend under the gateway's name for it (see
//! [`super::owned`]), or as read for the unnamed entry and an SQL cursor.

use super::names::Lookup;
use super::outbox::put_message;
use super::owned::{pick, Role, Target};
use super::*;
use crate::wire::messages::frontend;

impl Pipeline {
    /// A Bind as read (both names unnamed) or naming the backend's portal and statement;
    /// `names`: the lengths of the client's portal and statement names.
    pub(super) fn push_bind(
        &mut self,
        f: Frame,
        names: (usize, usize),
        (portal_target, stmt_target): (Target, Target),
        pending: Pending,
    ) {
        if names == (0, 0) {
            return self.push(f.raw, [pending]);
        }
        let body = f.body();
        let client_portal = &body[..names.0];
        let rest = &body[names.0 + names.1 + 2..];
        let portal_buf = self.backend_names.render(portal_target);
        let portal = pick(portal_target, &portal_buf, client_portal);
        let statement = self.backend_names.render(stmt_target);
        self.outbox.push_built(|out| {
            let parts: [&[u8]; 5] = [portal, b"\0", statement.as_bytes(), b"\0", rest];
            put_message(out, b'B', &parts);
            [pending]
        });
    }

    /// A Bind whose values cannot be read: the server refuses it (08P01) and binds
    /// nothing, but only if it reaches the statement the client named, under its backend
    /// name (else the server would answer that the statement does not exist).
    pub(super) fn on_unreadable_bind(&mut self, f: Frame) {
        let pending = Pending::Bind {
            swallow: false,
            change: None,
        };
        let body = f.body();
        let names = body.iter().position(|&c| c == 0).and_then(|p| {
            let s = body[p + 1..].iter().position(|&c| c == 0)?;
            Some((&body[..p], &body[p + 1..p + 1 + s]))
        });
        let Some((portal, statement)) = names.filter(|(p, s)| !p.is_empty() || !s.is_empty())
        else {
            return self.push(f.raw, [pending]);
        };
        let g = self.group;
        let n = &mut self.backend_names;
        let st = n.refer(
            statement,
            &self.prepared.lookup(statement, g),
            |p| p.backend,
            Role::Statement,
        );
        let pt = n.refer(
            portal,
            &self.portals.lookup(portal, g),
            |p| p.backend,
            Role::Portal,
        );
        let names = (portal.len(), statement.len());
        self.push_bind(f, names, (pt, st), pending);
    }

    pub(super) fn on_describe(&mut self, f: Frame) {
        let Some((kind, name)) = frontend::target(f.body()) else {
            let pending = Pending::Describe {
                swallow_nodata: false,
                portal_key: None,
                statement: None,
            };
            return self.push(f.raw, [pending]);
        };
        let (portal_key, statement, target) = if kind == b'P' {
            let lookup = self.portals.lookup(name, self.group);
            let t = self
                .backend_names
                .refer(name, &lookup, |p| p.backend, Role::Portal);
            (Some((name.to_vec(), self.binds)), None, t)
        } else {
            let lookup = self.prepared.lookup(name, self.group);
            let t = self
                .backend_names
                .refer(name, &lookup, |p| p.backend, Role::Statement);
            let id = match lookup {
                Lookup::Defined(p) => Some(p.id),
                _ => None,
            };
            (None, id.map(|id| (name.to_vec(), id)), t)
        };
        let pending = Pending::Describe {
            swallow_nodata: false,
            portal_key,
            statement,
        };
        self.push_target(f, kind, target, pending);
    }

    pub(super) fn on_close(&mut self, f: Frame) {
        let Some((kind, name)) = frontend::target(f.body()) else {
            let pending = Pending::Close {
                swallow: false,
                change: None,
            };
            return self.push(f.raw, [pending]);
        };
        let g = self.group;
        let (target, change) = if kind == b'S' {
            let lookup = self.prepared.lookup(name, g);
            let t = self
                .backend_names
                .refer(name, &lookup, |p| p.backend, Role::Statement);
            self.prepared.propose(name, None, g);
            (t, Change::Stmt(name.to_vec()))
        } else {
            let lookup = self.portals.lookup(name, g);
            let t = self
                .backend_names
                .refer(name, &lookup, |p| p.backend, Role::Portal);
            self.portals.propose(name, None, g);
            (t, Change::Portal(name.to_vec()))
        };
        let pending = Pending::Close {
            swallow: false,
            change: Some(change),
        };
        self.push_target(f, kind, target, pending);
    }

    /// A Describe or Close as read (the unnamed entry) or naming the backend's `target`.
    fn push_target(&mut self, f: Frame, kind: u8, target: Target, p: Pending) {
        if target.0 == 0 {
            // The unnamed entry, or an SQL cursor's own name: the message as read.
            return self.push(f.raw, [p]);
        }
        let name = self.backend_names.render(target);
        self.outbox.push_built(|out| {
            put_message(out, f.tag, &[&[kind], name.as_bytes(), b"\0"]);
            [p]
        });
    }
}

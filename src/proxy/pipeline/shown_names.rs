//! The server's errors and notices name what it holds, the gateway's backend names (see
//! `owned`); the client is shown its own name for each (`prepared statement "foobar" already
//! exists`, as a server would have said), so drivers and tests that read the message (asyncpg
//! matches it) see what they would see directly. A name the gateway cannot map back stays as
//! the server wrote it.

use bytes::{BufMut, Bytes, BytesMut};
use memchr::memmem;

use super::owned::SHOWN_NAME_MAX;
use super::Pipeline;
use crate::wire::frame::build;
use crate::wire::messages::error_fields;
use crate::wire::scrub::MAX_ERROR_FIELD;

/// Most digits of a backend name's number (a u64).
const DIGITS_MAX: usize = 20;

impl Pipeline {
    /// `msg` (a whole ErrorResponse or NoticeResponse) with this session's backend names in
    /// its fields replaced by the client's; None when it names none (relayed as it came).
    /// Runs before the scrub that cuts each field, and stops replacing in a field once it is
    /// past [`MAX_ERROR_FIELD`] (the scrub cuts there): an error the agent fills with backend
    /// names costs at most that much more.
    pub(super) fn with_client_names(&self, msg: &[u8]) -> Option<Bytes> {
        let prefix = self.backend_names.prefix();
        let body = msg.get(5..)?;
        memmem::find(body, prefix)?;
        let fields = error_fields(body)?;
        let mut b = BytesMut::with_capacity(msg.len());
        let mut changed = false;
        for (t, v) in fields {
            b.put_u8(t);
            let mut rest = v;
            let field_start = b.len();
            while let Some(i) = memmem::find(rest, prefix) {
                if b.len() - field_start > MAX_ERROR_FIELD {
                    break;
                }
                b.put_slice(&rest[..i]);
                let after = &rest[i + prefix.len()..];
                match self.client_name(after) {
                    Some((name, used)) => {
                        b.put_slice(name);
                        rest = &after[used..];
                        changed = true;
                    }
                    None => {
                        b.put_slice(prefix);
                        rest = after;
                    }
                }
            }
            b.put_slice(rest);
            b.put_u8(0);
        }
        b.put_u8(0);
        changed.then(|| build(msg[0], &b))
    }

    /// The client's name for the backend name whose prefix `after` follows (its role letter
    /// and number), and how many bytes of `after` that name takes.
    fn client_name(&self, after: &[u8]) -> Option<(&[u8], usize)> {
        let role = *after.first()?;
        let digits = after[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > DIGITS_MAX {
            return None;
        }
        let id: u64 = std::str::from_utf8(&after[1..1 + digits])
            .ok()?
            .parse()
            .ok()?;
        let name = match role {
            b's' => self.prepared.name_where(|p| p.backend == id)?,
            b'p' => self.portals.name_where(|p| p.backend == id)?,
            b'x' => self.backend_names.missing(id)?,
            _ => return None,
        };
        (name.len() <= SHOWN_NAME_MAX).then_some((name, 1 + digits))
    }
}

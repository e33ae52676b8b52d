//! A statement's kind from the server's answer: its command tag (what it did), not what the
//! lexer guessed from the text. `DELETE 10` is a write whatever the text looked like.

use super::classify::Kind;

/// What a result's command tag says the statement did; None when the tag does not tell
/// (`DO`, `CALL`, `EXPLAIN`, `SET`/`RESET` (a `SET ROLE` too), or `SELECT n` without rows
/// nor a row description: `CREATE TABLE AS` and `SELECT INTO` answer `SELECT n` as well).
/// `rows_seen`: the result sent a RowDescription or rows. `copy_out`: COPY sent data out.
pub fn kind_of_tag(tag: &str, rows_seen: bool, copy_out: bool) -> Option<Kind> {
    // Bytes, not `str::split`: this runs for every result the relay passes on.
    let t = tag.as_bytes();
    let (word, rest) = match t.iter().position(|&c| c == b' ') {
        Some(i) => (&t[..i], &t[i + 1..]),
        None => (t, &[][..]),
    };
    let second = || match rest.iter().position(|&c| c == b' ') {
        Some(i) => &rest[..i],
        None => rest,
    };
    Some(match word {
        b"SELECT" if rows_seen => Kind::Read,
        b"INSERT" | b"UPDATE" | b"DELETE" | b"MERGE" | b"TRUNCATE" => Kind::Write,
        b"COPY" if copy_out => Kind::Read,
        b"COPY" => Kind::Write,
        b"FETCH" | b"MOVE" | b"SHOW" => Kind::Read,
        b"BEGIN" | b"START" | b"COMMIT" | b"ROLLBACK" | b"SAVEPOINT" | b"RELEASE" => {
            Kind::Transaction
        }
        b"PREPARE" if second() == b"TRANSACTION" => Kind::Transaction,
        b"GRANT" | b"REVOKE" => Kind::Privilege,
        b"CREATE" | b"ALTER" | b"DROP" if matches!(second(), b"ROLE" | b"USER" | b"GROUP") => {
            Kind::Privilege
        }
        b"ALTER" if second() == b"DEFAULT" => Kind::Privilege,
        b"REFRESH" => Kind::Write,
        b"CREATE" | b"ALTER" | b"DROP" | b"COMMENT" | b"SECURITY" | b"IMPORT" => Kind::Ddl,
        b"PREPARE" | b"DEALLOCATE" | b"DISCARD" | b"LISTEN" | b"UNLISTEN" | b"NOTIFY"
        | b"VACUUM" | b"ANALYZE" | b"CHECKPOINT" | b"LOAD" | b"LOCK" | b"DECLARE" | b"CLOSE"
        | b"CLUSTER" | b"REINDEX" => Kind::Utility,
        _ => return None,
    })
}

/// Which of two kinds says more about what a statement did (a text of several statements
/// is as strong as its strongest result).
pub fn stronger(a: Kind, b: Kind) -> Kind {
    fn rank(k: Kind) -> u8 {
        match k {
            Kind::Unparsed => 0,
            Kind::Read => 1,
            Kind::Utility => 2,
            Kind::Transaction => 3,
            Kind::Write => 4,
            Kind::Ddl => 5,
            Kind::Privilege => 6,
        }
    }
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_kinds() {
        // (tag, rows seen, copy out, kind)
        let table: &[(&str, bool, bool, Option<Kind>)] = &[
            ("DELETE 10", false, false, Some(Kind::Write)),
            ("INSERT 0 1", false, false, Some(Kind::Write)),
            ("UPDATE 0", false, false, Some(Kind::Write)),
            ("MERGE 2", false, false, Some(Kind::Write)),
            ("TRUNCATE TABLE", false, false, Some(Kind::Write)),
            ("COPY 3", false, false, Some(Kind::Write)),
            ("COPY 3", false, true, Some(Kind::Read)),
            ("SELECT 3", true, false, Some(Kind::Read)),
            // CREATE TABLE AS / SELECT INTO answer SELECT n with no rows: not told.
            ("SELECT 3", false, false, None),
            ("FETCH 2", false, false, Some(Kind::Read)),
            ("SHOW", true, false, Some(Kind::Read)),
            ("BEGIN", false, false, Some(Kind::Transaction)),
            ("COMMIT", false, false, Some(Kind::Transaction)),
            ("ROLLBACK", false, false, Some(Kind::Transaction)),
            ("PREPARE TRANSACTION", false, false, Some(Kind::Transaction)),
            ("COMMIT PREPARED", false, false, Some(Kind::Transaction)),
            ("PREPARE", false, false, Some(Kind::Utility)),
            ("GRANT", false, false, Some(Kind::Privilege)),
            ("CREATE ROLE", false, false, Some(Kind::Privilege)),
            ("ALTER ROLE", false, false, Some(Kind::Privilege)),
            (
                "ALTER DEFAULT PRIVILEGES",
                false,
                false,
                Some(Kind::Privilege),
            ),
            ("CREATE TABLE", false, false, Some(Kind::Ddl)),
            ("DROP FUNCTION", false, false, Some(Kind::Ddl)),
            ("DISCARD ALL", false, false, Some(Kind::Utility)),
            ("DEALLOCATE ALL", false, false, Some(Kind::Utility)),
            ("DO", false, false, None),
            ("CALL", false, false, None),
            ("EXPLAIN", true, false, None),
            ("SET", false, false, None),
            ("", false, false, None),
        ];
        for (tag, rows, out, want) in table {
            assert_eq!(kind_of_tag(tag, *rows, *out), *want, "{tag}");
        }
        assert_eq!(stronger(Kind::Read, Kind::Write), Kind::Write);
        assert_eq!(stronger(Kind::Ddl, Kind::Write), Kind::Ddl);
        assert_eq!(stronger(Kind::Read, Kind::Unparsed), Kind::Read);
    }
}

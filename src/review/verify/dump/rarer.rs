//! The dump's queries for objects a task rarely makes but that change what a database does:
//! casts (an implicit cast changes which operator a query resolves to), conversions, text
//! search configurations, dictionaries, parsers and templates, operator classes and
//! families, languages, foreign-data wrappers, servers and user mappings, event triggers
//! (which run on DDL), transforms and access methods. Most need more than the agent role may
//! do; a superuser token can. Only objects the database made (OID past the built-in range)
//! that no extension owns.

use super::sql::{no_ext, qname, role, user_ns};

/// Objects with OIDs below this are built in (PostgreSQL's FirstNormalObjectId).
const FIRST_USER_OID: &str = "16384";

/// `(kind, query)` pairs, each query returning `(key, definition)`; `o` is the owner,
/// quoted as a literal.
pub(super) fn queries(o: &str) -> Vec<(&'static str, String)> {
    // `e` is no_ext's own alias: not one of the aliases here.
    let mine = |alias: &str, catalog: &str| {
        format!(
            "{alias}.oid >= {FIRST_USER_OID} AND {}",
            no_ext(catalog, &format!("{alias}.oid"))
        )
    };
    vec![
        (
            "cast",
            format!(
                "SELECT 'cast ' || pg_catalog.format_type(c.castsource, NULL) || ' as ' \
                 || pg_catalog.format_type(c.casttarget, NULL), \
                 'function=' || CASE WHEN c.castfunc = 0 THEN '-' \
                   ELSE c.castfunc::pg_catalog.regprocedure::pg_catalog.text END \
                 || ' context=' || c.castcontext::pg_catalog.text || ' method=' || c.castmethod::pg_catalog.text \
                 FROM pg_catalog.pg_cast c WHERE {}",
                mine("c", "pg_cast")
            ),
        ),
        (
            "conversion",
            format!(
                "SELECT 'conversion ' || {}, 'from=' || pg_catalog.pg_encoding_to_char(c.conforencoding) \
                 || ' to=' || pg_catalog.pg_encoding_to_char(c.contoencoding) \
                 || ' function=' || c.conproc::pg_catalog.regprocedure::pg_catalog.text \
                 || ' default=' || c.condefault || ' owner=' || ({}) \
                 FROM pg_catalog.pg_conversion c JOIN pg_catalog.pg_namespace n ON n.oid = c.connamespace \
                 WHERE {} AND {}",
                qname("n", "c.conname"),
                role("c.conowner", o),
                user_ns("n"),
                mine("c", "pg_conversion")
            ),
        ),
        (
            "text search configuration",
            format!(
                "SELECT 'text search configuration ' || {}, 'parser=' || c.cfgparser::pg_catalog.regproc::pg_catalog.text \
                 || ' mappings=' || COALESCE((SELECT pg_catalog.string_agg(m.maptokentype || ':' || m.mapseqno \
                   || '=' || m.mapdict::pg_catalog.regdictionary::pg_catalog.text, ',' \
                   ORDER BY m.maptokentype, m.mapseqno) FROM pg_catalog.pg_ts_config_map m \
                   WHERE m.mapcfg = c.oid), '') || ' owner=' || ({}) \
                 FROM pg_catalog.pg_ts_config c JOIN pg_catalog.pg_namespace n ON n.oid = c.cfgnamespace \
                 WHERE {} AND {}",
                qname("n", "c.cfgname"),
                role("c.cfgowner", o),
                user_ns("n"),
                mine("c", "pg_ts_config")
            ),
        ),
        (
            "text search dictionary",
            format!(
                "SELECT 'text search dictionary ' || {}, 'template=' || (SELECT pg_catalog.quote_ident(tn.nspname) || '.' || pg_catalog.quote_ident(t.tmplname) \
                   FROM pg_catalog.pg_ts_template t JOIN pg_catalog.pg_namespace tn ON tn.oid = t.tmplnamespace \
                   WHERE t.oid = d.dicttemplate) \
                 || ' options=' || COALESCE(d.dictinitoption, '') || ' owner=' || ({}) \
                 FROM pg_catalog.pg_ts_dict d JOIN pg_catalog.pg_namespace n ON n.oid = d.dictnamespace \
                 WHERE {} AND {}",
                qname("n", "d.dictname"),
                role("d.dictowner", o),
                user_ns("n"),
                mine("d", "pg_ts_dict")
            ),
        ),
        (
            "text search parser",
            format!(
                "SELECT 'text search parser ' || {}, 'start=' || p.prsstart::pg_catalog.text \
                 || ' token=' || p.prstoken::pg_catalog.text || ' end=' || p.prsend::pg_catalog.text \
                 || ' lextypes=' || p.prslextype::pg_catalog.text || ' headline=' || p.prsheadline::pg_catalog.text \
                 FROM pg_catalog.pg_ts_parser p JOIN pg_catalog.pg_namespace n ON n.oid = p.prsnamespace \
                 WHERE {} AND {}",
                qname("n", "p.prsname"),
                user_ns("n"),
                mine("p", "pg_ts_parser")
            ),
        ),
        (
            "text search template",
            format!(
                "SELECT 'text search template ' || {}, 'init=' || t.tmplinit::pg_catalog.text \
                 || ' lexize=' || t.tmpllexize::pg_catalog.text \
                 FROM pg_catalog.pg_ts_template t JOIN pg_catalog.pg_namespace n ON n.oid = t.tmplnamespace \
                 WHERE {} AND {}",
                qname("n", "t.tmplname"),
                user_ns("n"),
                mine("t", "pg_ts_template")
            ),
        ),
        (
            "operator class",
            format!(
                "SELECT 'operator class ' || {} || ' using ' || a.amname::pg_catalog.text, \
                 'type=' || pg_catalog.format_type(c.opcintype, NULL) || ' default=' || c.opcdefault \
                 || ' family=' || (SELECT pg_catalog.quote_ident(fn.nspname) || '.' || pg_catalog.quote_ident(f.opfname) \
                   FROM pg_catalog.pg_opfamily f JOIN pg_catalog.pg_namespace fn ON fn.oid = f.opfnamespace \
                   WHERE f.oid = c.opcfamily) || ' owner=' || ({}) \
                 FROM pg_catalog.pg_opclass c JOIN pg_catalog.pg_namespace n ON n.oid = c.opcnamespace \
                 JOIN pg_catalog.pg_am a ON a.oid = c.opcmethod WHERE {} AND {}",
                qname("n", "c.opcname"),
                role("c.opcowner", o),
                user_ns("n"),
                mine("c", "pg_opclass")
            ),
        ),
        (
            "operator family",
            format!(
                "SELECT 'operator family ' || {} || ' using ' || a.amname::pg_catalog.text, \
                 'operators=' || COALESCE((SELECT pg_catalog.string_agg(m.amopstrategy || ':' \
                   || m.amopopr::pg_catalog.regoperator::pg_catalog.text, ',' ORDER BY m.amopstrategy, m.amopopr) \
                   FROM pg_catalog.pg_amop m WHERE m.amopfamily = f.oid), '') \
                 || ' functions=' || COALESCE((SELECT pg_catalog.string_agg(p.amprocnum || ':' \
                   || p.amproc::pg_catalog.regprocedure::pg_catalog.text, ',' ORDER BY p.amprocnum, p.amproc) \
                   FROM pg_catalog.pg_amproc p WHERE p.amprocfamily = f.oid), '') || ' owner=' || ({}) \
                 FROM pg_catalog.pg_opfamily f JOIN pg_catalog.pg_namespace n ON n.oid = f.opfnamespace \
                 JOIN pg_catalog.pg_am a ON a.oid = f.opfmethod WHERE {} AND {}",
                qname("n", "f.opfname"),
                role("f.opfowner", o),
                user_ns("n"),
                mine("f", "pg_opfamily")
            ),
        ),
        (
            "language",
            format!(
                "SELECT 'language ' || pg_catalog.quote_ident(l.lanname), 'trusted=' || l.lanpltrusted \
                 || ' handler=' || l.lanplcallfoid::pg_catalog.regprocedure::pg_catalog.text \
                 || ' owner=' || ({}) FROM pg_catalog.pg_language l WHERE {}",
                role("l.lanowner", o),
                mine("l", "pg_language")
            ),
        ),
        (
            "foreign data wrapper",
            format!(
                "SELECT 'foreign data wrapper ' || pg_catalog.quote_ident(w.fdwname), \
                 'handler=' || w.fdwhandler::pg_catalog.regproc::pg_catalog.text \
                 || ' validator=' || w.fdwvalidator::pg_catalog.regproc::pg_catalog.text \
                 || ' options=' || COALESCE(pg_catalog.array_to_string(w.fdwoptions, ','), '') \
                 || ' owner=' || ({}) FROM pg_catalog.pg_foreign_data_wrapper w WHERE {}",
                role("w.fdwowner", o),
                mine("w", "pg_foreign_data_wrapper")
            ),
        ),
        (
            "foreign server",
            format!(
                "SELECT 'foreign server ' || pg_catalog.quote_ident(s.srvname), \
                 'wrapper=' || pg_catalog.quote_ident(w.fdwname) || ' type=' || COALESCE(s.srvtype, '') \
                 || ' version=' || COALESCE(s.srvversion, '') \
                 || ' options=' || COALESCE(pg_catalog.array_to_string(s.srvoptions, ','), '') \
                 || ' owner=' || ({}) FROM pg_catalog.pg_foreign_server s \
                 JOIN pg_catalog.pg_foreign_data_wrapper w ON w.oid = s.srvfdw WHERE {}",
                role("s.srvowner", o),
                mine("s", "pg_foreign_server")
            ),
        ),
        // Existence only: a mapping's options (passwords) are not the review's to read.
        (
            "user mapping",
            format!(
                "SELECT 'user mapping for ' || ({}) || ' server ' || pg_catalog.quote_ident(m.srvname), '' \
                 FROM pg_catalog.pg_user_mappings m WHERE m.umid >= {FIRST_USER_OID}",
                role("m.umuser", o)
            ),
        ),
        (
            "event trigger",
            format!(
                "SELECT 'event trigger ' || pg_catalog.quote_ident(et.evtname), 'event=' || et.evtevent \
                 || ' function=' || et.evtfoid::pg_catalog.regprocedure::pg_catalog.text \
                 || ' enabled=' || et.evtenabled::pg_catalog.text \
                 || ' tags=' || COALESCE(pg_catalog.array_to_string(et.evttags, ','), '') \
                 || ' owner=' || ({}) FROM pg_catalog.pg_event_trigger et WHERE {}",
                role("et.evtowner", o),
                mine("et", "pg_event_trigger")
            ),
        ),
        (
            "transform",
            format!(
                "SELECT 'transform for ' || pg_catalog.format_type(t.trftype, NULL) || ' language ' \
                 || pg_catalog.quote_ident(l.lanname), \
                 'from_sql=' || t.trffromsql::pg_catalog.regproc::pg_catalog.text \
                 || ' to_sql=' || t.trftosql::pg_catalog.regproc::pg_catalog.text \
                 FROM pg_catalog.pg_transform t JOIN pg_catalog.pg_language l ON l.oid = t.trflang WHERE {}",
                mine("t", "pg_transform")
            ),
        ),
        (
            "access method",
            format!(
                "SELECT 'access method ' || pg_catalog.quote_ident(a.amname), 'type=' || a.amtype::pg_catalog.text \
                 || ' handler=' || a.amhandler::pg_catalog.regproc::pg_catalog.text \
                 FROM pg_catalog.pg_am a WHERE {}",
                mine("a", "pg_am")
            ),
        ),
    ]
}

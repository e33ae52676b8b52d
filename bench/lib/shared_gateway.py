"""The gateway that the bench sections share (one on the machine's own file system, for the
sections that need no special golden or file system), and its base config."""
import os

import benchlib as bl

# One gateway on the machine's own file system, shared by the sections that don't need a
# special golden or file system; restarted with each section's config (tokens survive).
_shared = {}
# PgBouncer keeps its 16 server connections while sandpit's 16 run: room for both.
MAIN = "[pool]\nsize = 0\n[postgres]\nmax_connections = 64\n"


def shared(env, config=""):
    g = _shared.get("gw")
    if g is None:
        sql = bl.golden_sql(os.path.join(env.dir, "small.sql"), rows=20000)
        g = bl.Gateway(env, "main", os.path.join(env.dir, "main"), sql, config)
        _shared["gw"] = g
        _shared["config"] = config
    elif _shared["config"] != config:
        g.restart(config)
        _shared["config"] = config
    return g


def is_shared(g):
    """Whether `g` is the shared gateway (a section that made its own stops it)."""
    return g is _shared.get("gw")

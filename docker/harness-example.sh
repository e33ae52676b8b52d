#!/usr/bin/env bash
# An example harness run against the gateway (docker/compose.yaml runs it): issue a token
# for one task, let "the agent" (here: psql) run a destructive statement on its own
# scratch copy, show that a second token still sees the untouched golden, read the
# statement log, revoke. Needs SANDPIT_API and SANDPIT_ADMIN_KEY.
set -euo pipefail
token_id() { echo "$1" | sed 's|postgresql://\([^:]*\):.*|\1|'; }
dsn=$(sandpit token issue --task example-task --ttl 10m --max-rows 50)
other=$(sandpit token issue --task example-second-look --ttl 10m)
echo "agent DSN: postgresql://$(token_id "$dsn"):…@${dsn##*@}"
psql "$dsn" -X -c "DELETE FROM orders WHERE status = 'pending' OR TRUE"
psql "$dsn" -X -At -c "SELECT 'orders left in the scratch copy: ' || count(*) FROM orders"
psql "$other" -X -At -c "SELECT 'orders a second token sees: ' || count(*) FROM orders"
sandpit log example-task
sandpit token revoke "$(token_id "$dsn")"
sandpit token revoke "$(token_id "$other")"

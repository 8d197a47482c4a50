#!/usr/bin/env bash
# Start (or stop) the throw-away PostgreSQL, MariaDB and Redis the test suite runs against, and a
# PgBouncer in front of that PostgreSQL, on loopback. Usage: source scripts/services.sh;
# start_postgres; start_pgbouncer; start_pg_replica; start_mariadb; start_redis;
# start_redis_cluster; ...; stop_redis_cluster; stop_redis; stop_mariadb; stop_pg_replica;
# stop_pgbouncer; stop_postgres. The Redis Cluster has 3 primaries and 3 replicas (ports
# REDIS_CLUSTER_PORT to REDIS_CLUSTER_PORT + 5).
set -euo pipefail

SERVICES_DIR="${SERVICES_DIR:-$(pwd)/.services}"
PG_PORT="${PG_PORT:-54329}"
PG_DATA="$SERVICES_DIR/postgres"
PG_REPLICA_PORT="${PG_REPLICA_PORT:-54330}"
PG_REPLICA_DATA="$SERVICES_DIR/postgres-replica"
PG_REPLICA_PRIMARY_PORT="${PG_REPLICA_PRIMARY_PORT:-54331}"
PG_REPLICA_PRIMARY_DATA="$SERVICES_DIR/postgres-replica-primary"
MARIADB_PORT="${MARIADB_PORT:-33069}"
MARIADB_DIR="$SERVICES_DIR/mariadb"
REDIS_PORT="${REDIS_PORT:-63799}"
REDIS_DIR="$SERVICES_DIR/redis"
PGBOUNCER_PORT="${PGBOUNCER_PORT:-64329}"
PGBOUNCER_DIR="$SERVICES_DIR/pgbouncer"

# initdb and mariadbd refuse to run as root: as root, run them as the system user their Debian
# package makes ("postgres", "mysql"); otherwise as ourselves. Usage: _as USER COMMAND...
_as() {
  local user="$1"; shift
  if [ "$(id -u)" = "0" ]; then
    su "$user" -s /bin/bash -c "$*"
  else
    bash -c "$*"
  fi
}
_as_pg_user() { _as postgres "$@"; }
_as_mysql_user() { _as mysql "$@"; }

start_postgres() {
  PG_STARTED_HERE=0
  # Nothing streams from this one (the replica has a primary of its own): the least WAL.
  _start_pg_cluster "$PG_DATA" "$PG_PORT" "-c wal_level=minimal -c max_wal_senders=0" \
    && PG_STARTED_HERE="$PG_CLUSTER_STARTED" || return 1
  export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/idempotency"
  echo "PostgreSQL ready on 127.0.0.1:$PG_PORT"
}

# Starts the cluster in DATA on PORT (made with initdb if missing) with the EXTRA settings, unless
# it is running already; sets PG_CLUSTER_STARTED to 1 if it started it here. Usage:
# _start_pg_cluster DATA PORT EXTRA
_start_pg_cluster() {
  local data="$1" port="$2" extra="$3"
  command -v initdb >/dev/null || { echo "initdb not found on PATH: install PostgreSQL" >&2; return 1; }
  mkdir -p "$SERVICES_DIR"
  if [ "$(id -u)" = "0" ]; then chown postgres "$SERVICES_DIR"; chmod 755 "$SERVICES_DIR"; fi
  if [ ! -f "$data/PG_VERSION" ]; then
    _as_pg_user "initdb -D '$data' -U postgres --auth=trust -E UTF8 >'$data.initdb.log' 2>&1"
  fi
  PG_CLUSTER_STARTED=0
  if ! _as_pg_user "pg_ctl -D '$data' status" >/dev/null 2>&1; then
    PG_CLUSTER_STARTED=1
    # Throw-away data: skip the disk flushes, unless PG_DURABLE=1 asks for production settings.
    local durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off $extra"
    [ "${PG_DURABLE:-0}" = "1" ] && durability=""
    _as_pg_user "pg_ctl -D '$data' -l '$data.log' -w -t 60 start \
      -o \"-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories='$data' \
          -c max_connections=300 $durability\"" >/dev/null
  fi
}

# Stops the server only if start_postgres started it (a developer's running one is left alone).
stop_postgres() {
  if [ "${PG_STARTED_HERE:-0}" = "1" ]; then
    _as_pg_user "pg_ctl -D '$PG_DATA' -m fast -w stop" >/dev/null 2>&1 || true
  fi
}

# A PostgreSQL of its own and a streaming replica of it, for the tests of reads sent to a replica
# (tests/test_replica.py): the primary on PG_REPLICA_PRIMARY_PORT, so that the replica replays
# only those tests' writes, not every suite's (most of a minute of CPU a run); the replica a base
# backup taken with pg_basebackup -R (which writes the primary_conninfo and standby.signal),
# started as a hot standby. A primary made by initdb with --auth=trust already allows loopback
# replication connections, and PostgreSQL's defaults (wal_level=replica, max_wal_senders=10) serve
# it. A copy left by an earlier run is taken again (it may have fallen behind past the WAL the
# primary kept). The tests make it lag themselves (recovery_min_apply_delay, set with ALTER SYSTEM
# on the replica, then reset); PG_REPLICA_APPLY_DELAY (e.g. 2s), written to its postgresql.conf,
# starts it lagging.
start_pg_replica() {
  command -v pg_basebackup >/dev/null || { echo "pg_basebackup not found on PATH: install PostgreSQL" >&2; return 1; }
  PG_REPLICA_PRIMARY_STARTED_HERE=0
  _start_pg_cluster "$PG_REPLICA_PRIMARY_DATA" "$PG_REPLICA_PRIMARY_PORT" "" \
    && PG_REPLICA_PRIMARY_STARTED_HERE="$PG_CLUSTER_STARTED" || return 1
  PG_REPLICA_STARTED_HERE=0
  if ! _as_pg_user "pg_ctl -D '$PG_REPLICA_DATA' status" >/dev/null 2>&1; then
    PG_REPLICA_STARTED_HERE=1
    _as_pg_user "rm -rf '$PG_REPLICA_DATA' && pg_basebackup -h 127.0.0.1 -p $PG_REPLICA_PRIMARY_PORT \
      -U postgres -D '$PG_REPLICA_DATA' -R -X stream -c fast >'$SERVICES_DIR/pg_basebackup.log' 2>&1" \
      || { echo "pg_basebackup failed: see $SERVICES_DIR/pg_basebackup.log" >&2; return 1; }
    if [ -n "${PG_REPLICA_APPLY_DELAY:-}" ]; then
      _as_pg_user "echo \"recovery_min_apply_delay = '$PG_REPLICA_APPLY_DELAY'\" >>'$PG_REPLICA_DATA/postgresql.conf'"
    fi
    # Its own port and socket folder; the primary's flags (fsync=off...) are not carried over.
    _as_pg_user "pg_ctl -D '$PG_REPLICA_DATA' -l '$SERVICES_DIR/postgres-replica.log' -w -t 60 start \
      -o \"-c listen_addresses=127.0.0.1 -c port=$PG_REPLICA_PORT \
          -c unix_socket_directories='$PG_REPLICA_DATA' -c max_connections=300 \
          -c hot_standby=on -c fsync=off\"" >/dev/null \
      || { echo "The replica did not start: see $SERVICES_DIR/postgres-replica.log" >&2; return 1; }
  fi
  export PG_REPLICA_PRIMARY_URL="postgres://postgres@127.0.0.1:$PG_REPLICA_PRIMARY_PORT"
  export PG_REPLICA_URL="postgres://postgres@127.0.0.1:$PG_REPLICA_PORT"
  echo "PostgreSQL replica ready on 127.0.0.1:$PG_REPLICA_PORT, of 127.0.0.1:$PG_REPLICA_PRIMARY_PORT"
}

# Stops the replica and its primary, each only if start_pg_replica started it.
stop_pg_replica() {
  if [ "${PG_REPLICA_STARTED_HERE:-0}" = "1" ]; then
    _as_pg_user "pg_ctl -D '$PG_REPLICA_DATA' -m fast -w stop" >/dev/null 2>&1 || true
  fi
  if [ "${PG_REPLICA_PRIMARY_STARTED_HERE:-0}" = "1" ]; then
    _as_pg_user "pg_ctl -D '$PG_REPLICA_PRIMARY_DATA' -m fast -w stop" >/dev/null 2>&1 || true
  fi
}

# PgBouncer in transaction pooling in front of start_postgres's server (PG_PORT), as the
# deployments that pool their connections run it: every database on that server is reachable
# through it, as the same user, without a password (a throw-away pooler on loopback).
start_pgbouncer() {
  local binary
  binary="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
  [ -x "$binary" ] || { echo "pgbouncer not found: install Debian's pgbouncer" >&2; return 1; }
  mkdir -p "$PGBOUNCER_DIR"
  # PgBouncer refuses to run as root: as root it runs as "postgres", as PostgreSQL does.
  if [ "$(id -u)" = "0" ]; then chmod 755 "$SERVICES_DIR"; chown postgres "$PGBOUNCER_DIR"; fi
  PGBOUNCER_STARTED_HERE=0
  if ! _pgbouncer_answers; then
    PGBOUNCER_STARTED_HERE=1
    printf '"postgres" ""\n' >"$PGBOUNCER_DIR/userlist.txt"
    # - default_pool_size: few server connections for many clients, so that clients really
    #   share them (a statement of one client runs on the connection another just used).
    # - server_idle_timeout: an idle server connection is closed within a second or two, so
    #   that DROP DATABASE (a test database at the end of a run), which waits up to 5 s for the
    #   database's other sessions to end, is not refused because of this pooler's.
    # - ignore_startup_parameters: what drivers send that PgBouncer does not track.
    cat >"$PGBOUNCER_DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGBOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGBOUNCER_DIR/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = ${PGBOUNCER_POOL_SIZE:-4}
max_client_conn = 1000
server_idle_timeout = 1
ignore_startup_parameters = extra_float_digits,options
logfile = $PGBOUNCER_DIR/pgbouncer.log
pidfile = $PGBOUNCER_DIR/pgbouncer.pid
INI
    if [ "$(id -u)" = "0" ]; then chown postgres "$PGBOUNCER_DIR"/*; fi
    _as_pg_user "'$binary' -d -q '$PGBOUNCER_DIR/pgbouncer.ini'"
    for _ in $(seq 50); do _pgbouncer_answers && break; sleep 0.1; done
    _pgbouncer_answers \
      || { echo "PgBouncer did not start: see $PGBOUNCER_DIR/pgbouncer.log" >&2; return 1; }
  fi
  export PGBOUNCER_URL="postgres://postgres@127.0.0.1:$PGBOUNCER_PORT"
  echo "PgBouncer (transaction pooling) ready on 127.0.0.1:$PGBOUNCER_PORT"
}

# Whether PgBouncer answers on its port (its admin console needs no server behind it).
_pgbouncer_answers() {
  psql -X -q -h 127.0.0.1 -p "$PGBOUNCER_PORT" -U postgres -d pgbouncer -c "SHOW VERSION" \
    >/dev/null 2>&1
}

# Stops PgBouncer (at once, cutting its clients) only if start_pgbouncer started it, and returns
# once it has exited.
stop_pgbouncer() {
  if [ "${PGBOUNCER_STARTED_HERE:-0}" = "1" ]; then
    local pid
    pid="$(cat "$PGBOUNCER_DIR/pgbouncer.pid" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      { [ -z "$pid" ] || [ ! -e "/proc/$pid" ]; } && break
      sleep 0.1
    done
  fi
}

start_mariadb() {
  command -v mariadbd >/dev/null || { echo "mariadbd not found: install Debian's mariadb-server" >&2; return 1; }
  mkdir -p "$MARIADB_DIR"
  if [ "$(id -u)" = "0" ]; then chmod 755 "$SERVICES_DIR"; chown mysql "$MARIADB_DIR"; fi
  if [ ! -d "$MARIADB_DIR/data/mysql" ]; then
    # Root without a password, reachable on loopback only: a throw-away server for tests.
    _as_mysql_user "mariadb-install-db --no-defaults --datadir='$MARIADB_DIR/data' \
      --auth-root-authentication-method=normal --skip-test-db >'$MARIADB_DIR/install.log' 2>&1"
  fi
  MARIADB_STARTED_HERE=0
  if ! mariadb-admin --no-defaults -uroot -h127.0.0.1 -P"$MARIADB_PORT" ping >/dev/null 2>&1; then
    MARIADB_STARTED_HERE=1
    # Throw-away data: no flush at each commit, unless MARIADB_DURABLE=1 asks for it.
    local durability="--innodb-flush-log-at-trx-commit=0 --sync-binlog=0"
    [ "${MARIADB_DURABLE:-0}" = "1" ] && durability=""
    _as_mysql_user "nohup mariadbd --no-defaults --datadir='$MARIADB_DIR/data' \
      --bind-address=127.0.0.1 --port=$MARIADB_PORT --socket='$MARIADB_DIR/mariadb.sock' \
      --pid-file='$MARIADB_DIR/mariadb.pid' --log-error='$MARIADB_DIR/mariadb.log' \
      --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
      --max-connections=300 $durability >/dev/null 2>&1 &"
    for _ in $(seq 100); do
      mariadb-admin --no-defaults -uroot -h127.0.0.1 -P"$MARIADB_PORT" ping >/dev/null 2>&1 && break
      sleep 0.2
    done
    mariadb-admin --no-defaults -uroot -h127.0.0.1 -P"$MARIADB_PORT" ping >/dev/null \
      || { echo "MariaDB did not start: see $MARIADB_DIR/mariadb.log" >&2; return 1; }
  fi
  export MARIADB_URL="mysql://root@127.0.0.1:$MARIADB_PORT"
  echo "MariaDB ready on 127.0.0.1:$MARIADB_PORT"
}

# Stops the server only if start_mariadb started it, and returns once it has exited: over TCP,
# mariadb-admin's shutdown only asks for it, and the server goes on answering its open
# connections for a moment (a test that cuts the database off must not see one more answer).
stop_mariadb() {
  if [ "${MARIADB_STARTED_HERE:-0}" = "1" ]; then
    local pid
    pid="$(cat "$MARIADB_DIR/mariadb.pid" 2>/dev/null || true)"
    mariadb-admin --no-defaults -uroot -h127.0.0.1 -P"$MARIADB_PORT" shutdown >/dev/null 2>&1 || true
    for _ in $(seq 300); do
      { [ -z "$pid" ] || [ ! -e "/proc/$pid" ]; } && break
      sleep 0.1
    done
  fi
}

start_redis() {
  command -v redis-server >/dev/null || { echo "redis-server not found: install Debian's redis-server" >&2; return 1; }
  mkdir -p "$REDIS_DIR"
  REDIS_STARTED_HERE=0
  if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    REDIS_STARTED_HERE=1
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --dir "$REDIS_DIR" --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log"
    for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  echo "Redis ready on 127.0.0.1:$REDIS_PORT"
}

stop_redis() {
  if [ "${REDIS_STARTED_HERE:-0}" = "1" ]; then
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  fi
}

# A Redis Cluster: 6 nodes on consecutive ports from REDIS_CLUSTER_PORT, 3 primaries with a
# replica each, their cluster bus 1000 ports above (Redis's default, 10000 above, is past 65535
# for these ports). A small node timeout (REDIS_CLUSTER_NODE_TIMEOUT, ms) makes a replica take
# over from a killed primary within seconds, as the fail-over scenario needs.
REDIS_CLUSTER_PORT="${REDIS_CLUSTER_PORT:-63800}"
REDIS_CLUSTER_DIR="$SERVICES_DIR/redis-cluster"
REDIS_CLUSTER_NODE_TIMEOUT="${REDIS_CLUSTER_NODE_TIMEOUT:-2000}"

_redis_cluster_ports() { seq "$REDIS_CLUSTER_PORT" $((REDIS_CLUSTER_PORT + 5)); }

start_redis_cluster() {
  command -v redis-server >/dev/null || { echo "redis-server not found: install Debian's redis-server" >&2; return 1; }
  REDIS_CLUSTER_STARTED_HERE=0
  export REDIS_CLUSTER_URL="redis://127.0.0.1:$REDIS_CLUSTER_PORT"
  if redis-cli -p "$REDIS_CLUSTER_PORT" cluster info 2>/dev/null | grep -q "cluster_state:ok"; then
    echo "Redis Cluster already up on 127.0.0.1:$REDIS_CLUSTER_PORT"
    return 0
  fi
  REDIS_CLUSTER_STARTED_HERE=1
  local port nodes=()
  for port in $(_redis_cluster_ports); do
    mkdir -p "$REDIS_CLUSTER_DIR/$port"
    rm -f "$REDIS_CLUSTER_DIR/$port/nodes.conf"  # A cluster of its own each time.
    start_redis_cluster_node "$port"
    nodes+=("127.0.0.1:$port")
  done
  for port in $(_redis_cluster_ports); do
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  # Until every node agrees: the slots assigned, and every node knows the 3 replicas, each
  # with its link to its primary up (a client that reads the slot map sooner sees no replica).
  for _ in $(seq 200); do
    local ok=1
    for port in $(_redis_cluster_ports); do
      redis-cli -p "$port" cluster info | grep -q "cluster_state:ok" || ok=0
      [ "$(redis-cli -p "$port" cluster nodes | grep -c slave)" = "3" ] || ok=0
      if redis-cli -p "$port" info replication | grep -q "role:slave"; then
        redis-cli -p "$port" info replication | grep -q "master_link_status:up" || ok=0
      fi
    done
    [ "$ok" = "1" ] && break
    sleep 0.1
  done
  redis-cli -p "$REDIS_CLUSTER_PORT" cluster info | grep -q "cluster_state:ok" \
    || { echo "Redis Cluster on $REDIS_CLUSTER_PORT did not reach cluster_state:ok" >&2; return 1; }
  echo "Redis Cluster ready on 127.0.0.1:$REDIS_CLUSTER_PORT-$((REDIS_CLUSTER_PORT + 5))"
}

# One node of the cluster, on PORT; started again after a crash it rejoins the cluster it knew
# (its nodes.conf), as a replica if another node took over its slots meanwhile.
start_redis_cluster_node() {
  local port="$1"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --cluster-enabled yes --cluster-port $((port + 1000)) \
    --cluster-config-file "$REDIS_CLUSTER_DIR/$port/nodes.conf" \
    --cluster-node-timeout "$REDIS_CLUSTER_NODE_TIMEOUT" --dir "$REDIS_CLUSTER_DIR/$port" \
    --pidfile "$REDIS_CLUSTER_DIR/$port/redis.pid" --logfile "$REDIS_CLUSTER_DIR/$port/redis.log"
}

stop_redis_cluster() {
  if [ "${REDIS_CLUSTER_STARTED_HERE:-0}" = "1" ]; then
    local port
    for port in $(_redis_cluster_ports); do
      redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done
  fi
}

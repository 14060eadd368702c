#!/usr/bin/env bash
# A one-node SLURM cluster with accounting, and a PostgreSQL server, on this machine (for the tests marked
# `cluster` and for trying the SLURM launcher and shared tuner studies). Needs root and Debian's apt.
#   make cluster-up            # or: bash tools/cluster/up.sh
#   make cluster-down          # stops only what up started (pid files under $STATE)
# Idempotent: a second `up` finds everything running and does nothing.
# Writes: $STATE (default /var/tmp/pipeline-cluster: daemons' data, logs, pid files, env),
#         /etc/slurm/{slurm,slurmdbd}.conf (marked as written by this script).
# $STATE/env holds what tests need: PIPELINE_CLUSTER_PARTITION, PIPELINE_CLUSTER_PG_URL.
set -euo pipefail

STATE=${PIPELINE_CLUSTER_DIR:-/var/tmp/pipeline-cluster}
PARTITION=test
CLUSTER=pipeline
MYSQL_PORT=${PIPELINE_CLUSTER_MYSQL_PORT:-53306}
PG_PORT=${PIPELINE_CLUSTER_PG_PORT:-55432}
PG_URL="postgresql://pipeline:pipeline@127.0.0.1:${PG_PORT}/pipeline_tune"
MARK="# written by pipeline tools/cluster/up.sh"

say() { echo "cluster: $*"; }
die() { echo "cluster: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "not root: the local test cluster needs root (apt-get install, daemons); cluster tests will skip"

# Is the process in pid file $1 alive?
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# Remember that up started the daemon with pid file $1 (down.sh stops exactly these).
started() { grep -qxF "$1" "$STATE/started" 2>/dev/null || echo "$1" >>"$STATE/started"; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq 1 $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what did not come up within ${limit}s (logs: $STATE/log/)"
}

# --- packages ---------------------------------------------------------------------------------------------
need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v slurmdbd >/dev/null || need+=(slurmdbd)
command -v munged >/dev/null || need+=(munge)
command -v mariadbd >/dev/null || need+=(mariadb-server)
[ -x /usr/lib/postgresql/15/bin/postgres ] || ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them; cluster tests will skip"
  say "installing ${need[*]} (Debian packages)"
  # Keep the packages' init scripts from starting their own daemons: this script starts what it needs.
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' >$policy && chmod +x $policy && own_policy=1; fi
  trap '[ $own_policy = 1 ] && rm -f $policy' EXIT
  apt-get update -qq >/dev/null || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || die "apt-get install ${need[*]} failed"
  [ $own_policy = 1 ] && rm -f $policy
  trap - EXIT
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

mkdir -p "$STATE"/{log,run,slurmctld,slurmd,mysql-run}
touch "$STATE/started"

# --- munge (SLURM's authentication) --------------------------------------------------------------------------
[ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
  || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge
mkdir -p "$STATE/munge" && chown munge:munge "$STATE/munge"
if munge -n </dev/null >/dev/null 2>&1; then
  say "munged already running"
else
  runuser -u munge -- munged --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log"
  started "$STATE/munge/munged.pid"
  wait_for 10 munged sh -c 'munge -n </dev/null | unmunge'
fi

# --- MariaDB (slurmdbd's store), on its own data dir and loopback port ----------------------------------------
MYSQL_PID=$STATE/mysql-run/mariadbd.pid
if alive "$MYSQL_PID"; then
  say "mariadb already running"
else
  if [ ! -d "$STATE/mysql/mysql" ]; then
    mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=socket \
      >"$STATE/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (see $STATE/log/mariadb-install.log)"
  fi
  nohup mariadbd --user=root --datadir="$STATE/mysql" --port="$MYSQL_PORT" --bind-address=127.0.0.1 \
    --socket="$STATE/mysql-run/mysqld.sock" --pid-file="$MYSQL_PID" --log-error="$STATE/log/mariadb.log" \
    --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 --skip-name-resolve >/dev/null 2>&1 &
  started "$MYSQL_PID"
  wait_for 60 mariadb mariadb --socket="$STATE/mysql-run/mysqld.sock" -e 'select 1'
fi
mariadb --socket="$STATE/mysql-run/mysqld.sock" <<'SQL'
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL

# --- SLURM configs ------------------------------------------------------------------------------------------
node_line=$(slurmd -C | head -1)   # NodeName=<host> CPUs=... RealMemory=... read off this machine
node=$(hostname -s)
mkdir -p /etc/slurm
write_conf() {  # write_conf PATH MODE: stdin -> PATH, refusing to overwrite a config this script did not write
  local path=$1 mode=$2 tmp
  if [ -e "$path" ] && ! grep -qxF "$MARK" "$path"; then die "$path exists and was not written by up.sh: not touching it"; fi
  tmp=$(mktemp) && { echo "$MARK"; cat; } >"$tmp"
  if ! cmp -s "$tmp" "$path" 2>/dev/null; then install -m "$mode" "$tmp" "$path"; fi
  rm -f "$tmp"
}
write_conf /etc/slurm/slurm.conf 644 <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$node
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
MpiDefault=none
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$node
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=10
$node_line
PartitionName=$PARTITION Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
write_conf /etc/slurm/slurmdbd.conf 600 <<EOF
DbdHost=$node
SlurmUser=root
AuthType=auth/munge
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF

# --- slurmdbd, then the accounting cluster/account, slurmctld, slurmd -------------------------------------------
if alive "$STATE/run/slurmdbd.pid"; then
  say "slurmdbd already running"
else
  slurmdbd || die "slurmdbd did not start (see $STATE/log/slurmdbd.log)"
  started "$STATE/run/slurmdbd.pid"
  wait_for 60 slurmdbd sacctmgr -n list cluster
fi
sacctmgr -n list cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
sacctmgr -n list account format=account | grep -qw pipeline || sacctmgr -i add account pipeline cluster="$CLUSTER" >/dev/null
sacctmgr -n list user format=user | grep -qw root || sacctmgr -i add user root account=pipeline >/dev/null

if alive "$STATE/run/slurmctld.pid"; then
  say "slurmctld already running"
else
  slurmctld || die "slurmctld did not start (see $STATE/log/slurmctld.log)"
  started "$STATE/run/slurmctld.pid"
  wait_for 30 slurmctld scontrol ping
fi
if alive "$STATE/run/slurmd.pid"; then
  say "slurmd already running"
else
  slurmd || die "slurmd did not start (see $STATE/log/slurmd.log)"
  started "$STATE/run/slurmd.pid"
fi
# A node left down/drained by an earlier stop comes back.
if sinfo -h -n "$node" -o %t | grep -Eq 'down|drain'; then scontrol update nodename="$node" state=resume || true; fi
wait_for 60 "node $node (idle in sinfo)" sh -c "sinfo -h -p $PARTITION -n $node -o %t | grep -Eq '^(idle|mix|alloc)'"

# --- PostgreSQL (shared tuner studies), own data dir, loopback port -----------------------------------------
PGDATA=$STATE/pg
mkdir -p "$STATE/pg-run" && chown postgres:postgres "$STATE/pg-run"
if [ -s "$PGDATA/postmaster.pid" ] && kill -0 "$(head -1 "$PGDATA/postmaster.pid")" 2>/dev/null; then
  say "postgresql already running"
else
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA"
    runuser -u postgres -- "$PGBIN/initdb" -D "$PGDATA" -A trust -U postgres >"$STATE/log/initdb.log" 2>&1 \
      || die "initdb failed (see $STATE/log/initdb.log)"
  fi
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -l "$STATE/pg-run/postgresql.log" -w -t 60 \
    -o "-p $PG_PORT -k $STATE/pg-run -c listen_addresses=127.0.0.1" start >/dev/null \
    || die "postgresql did not start (see $STATE/pg-run/postgresql.log)"
  started "$PGDATA/postmaster.pid"
fi
psql_() { runuser -u postgres -- psql -h "$STATE/pg-run" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
[ "$(psql_ -c "select 1 from pg_roles where rolname='pipeline'")" = 1 ] \
  || psql_ -c "create role pipeline login password 'pipeline'"
[ "$(psql_ -c "select 1 from pg_database where datname='pipeline_tune'")" = 1 ] \
  || psql_ -c "create database pipeline_tune owner pipeline"

cat >"$STATE/env" <<EOF
PIPELINE_CLUSTER_PARTITION=$PARTITION
PIPELINE_CLUSTER_PG_URL=$PG_URL
EOF
say "up: partition '$PARTITION' on node $node ($(sinfo -h -p $PARTITION -o '%c CPUs, %m MB, %t')), accounting '$CLUSTER', postgres $PG_URL"

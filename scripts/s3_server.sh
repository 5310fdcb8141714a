#!/usr/bin/env bash
# s3_server.sh - a real S3-compatible server on the loopback address for ckptio's tests:
# OpenStack Swift (Debian 12's packages) with its s3api middleware and tempauth, one replica,
# storage on the local disk, and memcached (tempauth keeps its S3 users' records there).
#
#   scripts/s3_server.sh start   install what is missing, start the server (or find it running),
#                                wait until it answers, create the test buckets, print `export`
#                                lines for `eval "$(scripts/s3_server.sh start)"`
#   scripts/s3_server.sh env     print the `export` lines of the running server (exit 1 if none)
#   scripts/s3_server.sh stop    end every process it started and remove its state
#
# Settings (environment): CKPTIO_TEST_S3_PORT (the S3 endpoint's port, default 18480; the account,
# container and object servers and memcached take the next four), CKPTIO_TEST_S3_DIR (state, rings, data and logs;
# default ${TMPDIR:-/tmp}/ckptio-s3-UID-PORT), CKPTIO_TEST_S3_WORKERS (proxy processes, default 1:
# start-up time matters more than throughput in tests), CKPTIO_TEST_S3_OBJECT_WORKERS (object server processes,
# default 0: the server's own process), CKPTIO_TEST_S3_BUCKETS (buckets to create,
# default "ckptio-test ckptio-test2"), CKPTIO_TEST_S3_PYTHON (the interpreter that imports swift, default
# /usr/bin/python3; for a Swift installed with pip, give its python and put its swift-* scripts and memcached first
# on PATH: nothing is installed then).
# What Swift 2.30's s3api does and does not do: docs/OBJECT_STORAGE.md.
set -euo pipefail

port=${CKPTIO_TEST_S3_PORT:-18480}
dir=${CKPTIO_TEST_S3_DIR:-${TMPDIR:-/tmp}/ckptio-s3-$(id -u)-$port}
workers=${CKPTIO_TEST_S3_WORKERS:-1}
object_workers=${CKPTIO_TEST_S3_OBJECT_WORKERS:-0}
buckets=${CKPTIO_TEST_S3_BUCKETS:-"ckptio-test ckptio-test2"}
python=${CKPTIO_TEST_S3_PYTHON:-/usr/bin/python3}
access_key="test:tester"
secret_key="testing"
region="us-east-1"
servers=(memcached proxy account container object)

say() { echo "s3_server.sh: $*" >&2; }

print_env() {
    echo "export AWS_ENDPOINT_URL=http://127.0.0.1:$port"
    echo "export AWS_ACCESS_KEY_ID='$access_key'"
    echo "export AWS_SECRET_ACCESS_KEY='$secret_key'"
    echo "export AWS_REGION=$region"
    echo "export CKPTIO_TEST_S3_BUCKET=${buckets%% *}"
}

install_missing() {
    if command -v swift-proxy-server >/dev/null && command -v swift-object-server >/dev/null &&
        command -v swift-ring-builder >/dev/null && command -v memcached >/dev/null && command -v curl >/dev/null &&
        "$python" -c 'import swift.common.middleware.s3api, lxml' 2>/dev/null; then
        return 0
    fi
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    say "installing OpenStack Swift from Debian's packages"
    # Installing starts nothing: the packages' services need a running init system, and
    # policy-rc.d keeps them from starting where one runs.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod 755 "$policy" && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        swift-proxy swift-account swift-container swift-object python3-swift memcached curl >/dev/null ||
        { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
            --no-install-recommends swift-proxy swift-account swift-container swift-object python3-swift memcached curl \
            >/dev/null; }
    [ "$made_policy" = 0 ] || $sudo rm -f "$policy"
}

# True when every server's pid is alive.
running() {
    local s
    for s in "${servers[@]}"; do
        [ -f "$dir/run/$s.pid" ] && kill -0 "$(cat "$dir/run/$s.pid")" 2>/dev/null || return 1
    done
}

answers() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$port/healthcheck"; }

write_config() {
    rm -rf "$dir"
    mkdir -p "$dir"/{run,log,srv/d1,cache}
    local user
    user=$(id -un)
    # swift.conf: the hash suffix makes this cluster's partition layout its own.
    cat >"$dir/swift.conf" <<EOF
[swift-hash]
swift_hash_path_suffix = ckptio-test
swift_hash_path_prefix = ckptio-test
[storage-policy:0]
name = Policy-0
default = yes
[swift-constraints]
max_file_size = 5368709122
max_manifest_segments = 10000
EOF
    local common="bind_ip = 127.0.0.1
swift_dir = $dir
user = $user
devices = $dir/srv
mount_check = false
log_name = %s
log_facility = LOG_LOCAL0
log_address = /nonexistent"
    local i=1 s
    for s in account container object; do
        {
            echo "[DEFAULT]"
            echo "bind_port = $((port + i))"
            printf '%s\n' "${common//%s/$s}"
            if [ "$s" = object ]; then echo "workers = $object_workers"; else echo "workers = 0"; fi
            echo "[pipeline:main]"
            echo "pipeline = $s-server"
            echo "[app:$s-server]"
            echo "use = egg:swift#$s"
            [ "$s" = container ] && echo "allow_versions = false"
            [ "$s" = object ] && printf 'disk_chunk_size = 1048576\nnetwork_chunk_size = 1048576\n'
            echo "[$s-replicator]"
            echo "[$s-updater]"
            echo "[$s-auditor]"
        } >"$dir/$s-server.conf"
        i=$((i + 1))
    done
    # The proxy: s3api in front of tempauth (user "test:tester", key "testing"); SLO backs multipart
    # uploads (up to 10,000 parts as on AWS; Swift's default is 1,000); no memcache (tempauth checks
    # S3 signatures without it).
    cat >"$dir/proxy-server.conf" <<EOF
[DEFAULT]
bind_ip = 127.0.0.1
bind_port = $port
swift_dir = $dir
user = $user
workers = $workers
log_name = proxy
log_address = /nonexistent
client_timeout = 60
[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy-logging cache listing_formats s3api tempauth copy slo dlo proxy-logging proxy-server
[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
allow_account_management = true
object_chunk_size = 1048576
client_chunk_size = 1048576
[filter:catch_errors]
use = egg:swift#catch_errors
[filter:gatekeeper]
use = egg:swift#gatekeeper
[filter:healthcheck]
use = egg:swift#healthcheck
[filter:proxy-logging]
use = egg:swift#proxy_logging
[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:$((port + 4))
[filter:listing_formats]
use = egg:swift#listing_formats
[filter:s3api]
use = egg:swift#s3api
location = $region
storage_domain = localhost
max_upload_part_num = 10000
allowable_clock_skew = 900
[filter:tempauth]
use = egg:swift#tempauth
user_test_tester = $secret_key .admin
[filter:copy]
use = egg:swift#copy
[filter:slo]
use = egg:swift#slo
max_manifest_segments = 10000
max_manifest_size = 8388608
[filter:dlo]
use = egg:swift#dlo
EOF
    # One replica on one device: the rings every server reads.
    local ring builder
    i=1
    for ring in account container object; do
        builder="$dir/$ring.builder"
        swift-ring-builder "$builder" create 6 1 1 >/dev/null
        swift-ring-builder "$builder" add "r1z1-127.0.0.1:$((port + i))/d1" 1 >/dev/null
        swift-ring-builder "$builder" rebalance >/dev/null 2>&1 || true
        i=$((i + 1))
    done
}

# Creates the buckets with signed S3 requests (SigV4 in a few lines of the standard library: curl's
# own signer cannot sign for an access key with a colon in it, and tempauth's tokens need memcache).
make_buckets() {
    "$python" - "$port" "$access_key" "$secret_key" "$region" $buckets <<'PY'
import datetime, hashlib, hmac, http.client, sys
port, ak, sk, region, buckets = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
def h(k, m): return hmac.new(k, m.encode(), hashlib.sha256).digest()
for b in buckets:
    now = datetime.datetime.now(datetime.timezone.utc)
    amz, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host, empty = "127.0.0.1:%d" % port, hashlib.sha256(b"").hexdigest()
    canon = "PUT\n/%s\n\nhost:%s\nx-amz-content-sha256:%s\nx-amz-date:%s\n\nhost;x-amz-content-sha256;x-amz-date\n%s" % (
        b, host, empty, amz, empty)
    scope = "%s/%s/s3/aws4_request" % (day, region)
    text = "AWS4-HMAC-SHA256\n%s\n%s\n%s" % (amz, scope, hashlib.sha256(canon.encode()).hexdigest())
    key = h(h(h(h(("AWS4" + sk).encode(), day), region), "s3"), "aws4_request")
    sig = hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
    auth = "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=%s" % (
        ak, scope, sig)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("PUT", "/" + b, headers={"Host": host, "x-amz-date": amz, "x-amz-content-sha256": empty,
                                       "Authorization": auth, "Content-Length": "0"})
    r = c.getresponse()
    body = r.read()
    # 200: created; 409 BucketAlreadyOwnedByYou: there from before.
    if r.status not in (200, 409):
        sys.exit("PUT bucket %s: HTTP %d %s" % (b, r.status, body[:300]))
PY
}

start() {
    if running && answers; then
        print_env
        return 0
    fi
    stop_servers
    install_missing
    write_config
    local s conf
    setsid memcached -l 127.0.0.1 -p $((port + 4)) -U 0 -m 64 -u "$(id -un)" >"$dir/log/memcached.log" 2>&1 \
        </dev/null &
    echo $! >"$dir/run/memcached.pid"
    for s in "${servers[@]:1}"; do
        conf="$dir/$s-server.conf"
        # setsid: each server leads its own process group, which stop ends whole (the proxy's workers).
        setsid "swift-$s-server" "$conf" >"$dir/log/$s.log" 2>&1 </dev/null &
        echo $! >"$dir/run/$s.pid"
    done
    local t0=$SECONDS
    until answers; do
        if ! running; then
            say "a server exited while starting; its log:"
            for s in "${servers[@]}"; do tail -n 20 "$dir/log/$s.log" >&2; done
            stop_servers
            exit 1
        fi
        if [ $((SECONDS - t0)) -gt 60 ]; then
            say "the server did not answer within 60 s"
            stop_servers
            exit 1
        fi
        sleep 0.1
    done
    # The account and container servers may answer later than the proxy: retry.
    local tries=0
    until make_buckets 2>"$dir/log/buckets.log"; do
        tries=$((tries + 1))
        if [ $tries -gt 100 ]; then
            say "could not create the buckets $buckets: $(tail -n 1 "$dir/log/buckets.log")"
            stop_servers
            exit 1
        fi
        sleep 0.1
    done
    print_env
}

stop_servers() {
    local s pid
    for s in "${servers[@]}"; do
        [ -f "$dir/run/$s.pid" ] || continue
        pid=$(cat "$dir/run/$s.pid")
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    for s in "${servers[@]}"; do
        [ -f "$dir/run/$s.pid" ] || continue
        pid=$(cat "$dir/run/$s.pid")
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        rm -f "$dir/run/$s.pid"
    done
}

case "${1:-}" in
start) start ;;
env)
    running && answers || { say "no server is running on port $port"; exit 1; }
    print_env
    ;;
stop)
    stop_servers
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start|stop|env" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Builds the container images the test harness uses when the official ones (redis,
# postgres, quay.io/coreos/etcd) cannot be pulled: machines without a registry. Each
# image holds one server from this machine's Debian packages (the binary, the shared
# libraries it links, the data files it needs) in a root filesystem made here and
# imported with `docker import`; no base image is pulled.
#
#   lease-test/redis:7          redis-server         (Debian package redis-server)
#   lease-test/postgres:15      initdb + postgres    (Debian package postgresql-15)
#   lease-test/etcd:3.4         etcd                 (Debian package etcd-server)
#   lease-test/mariadb:10.11    mariadbd             (Debian package mariadb-server)
#   lease-test/zookeeper:3.8    ZooKeeper server     (Debian packages zookeeper, openjdk-17-jre-headless)
#
# An image that exists already is kept (the tags are the cache), unless an earlier
# revision of this script built it where the image's revision matters (see `wanted`);
# --force builds again.
# Without a Docker engine that answers, this does nothing and exits 0.
set -euo pipefail

force=0
[ "${1:-}" = "--force" ] && force=1

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "build-test-images: no Docker engine answers; nothing built"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# copy_with_libs ROOT FILE...: FILE and every shared library it links, at the same paths.
copy_with_libs() {
  local root=$1
  shift
  local f lib
  for f in "$@"; do
    mkdir -p "$root$(dirname "$f")"
    cp -L "$f" "$root$f"
    for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
      mkdir -p "$root$(dirname "$lib")"
      cp -Ln "$lib" "$root$lib" 2>/dev/null || true
    done
  done
}

# base ROOT: the files every image needs: users, /tmp.
base() {
  local root=$1
  mkdir -p "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999:postgres:/var/lib/postgresql:/bin/sh\n' >"$root/etc/passwd"
  printf 'root:x:0:\npostgres:x:999:\n' >"$root/etc/group"
}

# wanted IMAGE [REVISION]: whether IMAGE is to be built: it does not exist, --force was
# given, or it was built by an earlier revision of this script than REVISION (the image's
# label lease.test.revision, none counting as 0; an image whose entrypoint changed is
# built again, a newer one is kept).
wanted() {
  if [ "$force" = 0 ] && docker image inspect "$1" >/dev/null 2>&1; then
    local have
    have=$(docker image inspect --format '{{index .Config.Labels "lease.test.revision"}}' "$1" 2>/dev/null || true)
    if [ -z "${2:-}" ] || [ "${have:-0}" -ge "$2" ] 2>/dev/null; then
      echo "build-test-images: $1 exists"
      return 1
    fi
    echo "build-test-images: $1 exists from an earlier revision (${have:-none}, now $2): building again"
  fi
  return 0
}

if wanted lease-test/redis:7; then
  root=$work/redis
  base "$root"
  mkdir -p "$root/data"
  copy_with_libs "$root" "$(command -v redis-server)"
  tar -C "$root" -c . | docker import \
    -c 'WORKDIR /data' -c 'CMD ["redis-server", "--protected-mode", "no"]' \
    -c 'ENV PATH=/usr/bin:/bin' -c 'EXPOSE 6379' - lease-test/redis:7 >/dev/null
  echo "build-test-images: built lease-test/redis:7 ($(redis-server --version | cut -d' ' -f3))"
fi

if wanted lease-test/etcd:3.4; then
  root=$work/etcd
  base "$root"
  mkdir -p "$root/var/lib/etcd"
  copy_with_libs "$root" "$(command -v etcd)"
  # The official image has it at /usr/local/bin/etcd; the harness's command says so.
  mkdir -p "$root/usr/local/bin"
  ln -sf "$(command -v etcd)" "$root/usr/local/bin/etcd"
  tar -C "$root" -c . | docker import \
    -c 'WORKDIR /var/lib/etcd' -c 'CMD ["/usr/local/bin/etcd"]' \
    -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' -c 'EXPOSE 2379' - lease-test/etcd:3.4 >/dev/null
  echo "build-test-images: built lease-test/etcd:3.4 ($(etcd --version | head -1))"
fi

if wanted lease-test/postgres:15; then
  root=$work/postgres
  base "$root"
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  pgver=$(basename "$(dirname "$pgbin")")
  copy_with_libs "$root" "$pgbin/postgres" "$pgbin/initdb" /bin/sh
  mkdir -p "$root/usr/lib/postgresql/$pgver/lib" "$root/usr/share/postgresql"
  cp -a "/usr/lib/postgresql/$pgver/lib/." "$root/usr/lib/postgresql/$pgver/lib/"
  cp -a "/usr/share/postgresql/$pgver" "$root/usr/share/postgresql/"
  # Debian's PostgreSQL reads time zones from the system's tzdata: without them a client
  # that sets TimeZone (sqlx sets UTC) is refused at connect.
  mkdir -p "$root/usr/share"
  cp -a /usr/share/zoneinfo "$root/usr/share/"
  for lib in "$root/usr/lib/postgresql/$pgver/lib/"*.so; do
    copy_with_libs "$root" "${lib#"$root"}" >/dev/null 2>&1 || true
  done
  mkdir -p "$root/var/lib/postgresql/data" "$root/var/run/postgresql"
  chown -R 999:999 "$root/var/lib/postgresql" "$root/var/run/postgresql"
  # The entrypoint: a cluster with trust authentication for every address (a test
  # server on a private network), then the server in the foreground. Like the official
  # image it says "ready" on stdout once the cluster is made, and the server logs to
  # stderr.
  cat >"$root/entrypoint.sh" <<EOF
#!/bin/sh
set -e
data=/var/lib/postgresql/data
if [ ! -s "\$data/PG_VERSION" ]; then
  $pgbin/initdb -D "\$data" -U postgres --auth=trust --no-locale -E UTF8 >/dev/null
  echo "host all all 0.0.0.0/0 trust" >>"\$data/pg_hba.conf"
  echo "lease-test image: cluster initialised; database system is ready to accept connections"
fi
exec $pgbin/postgres -D "\$data" -c listen_addresses='*' "\$@"
EOF
  chmod 755 "$root/entrypoint.sh"
  tar -C "$root" -c . | docker import \
    -c 'USER postgres' -c 'ENTRYPOINT ["/entrypoint.sh"]' \
    -c "ENV PATH=$pgbin:/usr/bin:/bin" -c 'EXPOSE 5432' - lease-test/postgres:15 >/dev/null
  echo "build-test-images: built lease-test/postgres:15 ($("$pgbin/postgres" --version))"
fi

if wanted lease-test/mariadb:10.11; then
  if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
    echo "build-test-images: no mariadbd (apt-get install mariadb-server); lease-test/mariadb:10.11 not built"
  else
    root=$work/mariadb
    base "$root"
    mariadbd=$(command -v mariadbd || echo /usr/sbin/mariadbd)
    copy_with_libs "$root" "$mariadbd" /bin/sh
    # Error messages and character sets (the server's lc-messages-dir and
    # character-sets-dir).
    mkdir -p "$root/usr/share"
    cp -a /usr/share/mysql "$root/usr/share/"
    # The system tables are made here, by the same server, so the image needs no
    # bootstrap tools: root without a password, no test database.
    mkdir -p "$root/var/lib/mysql" "$root/run/mysqld" "$work/mariadb-tmp"
    mariadb-install-db --no-defaults --datadir="$root/var/lib/mysql" --tmpdir="$work/mariadb-tmp" \
      --auth-root-authentication-method=normal --skip-test-db --user="$(id -un)" >/dev/null
    # Clients come from other addresses (the host through a published port, other
    # containers): root from anywhere, as the official image's MARIADB_ROOT_HOST=%
    # does, and the database `lease`, as its MARIADB_DATABASE=lease does.
    cat >"$root/init.sql" <<'EOF2'
CREATE USER IF NOT EXISTS 'root'@'%';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS lease;
EOF2
    # Like the official image: arguments that start with a dash go to the server; the
    # server says "ready for connections" with its port on stderr.
    cat >"$root/entrypoint.sh" <<'EOF2'
#!/bin/sh
set -e
exec /usr/sbin/mariadbd --no-defaults --user=root --datadir=/var/lib/mysql \
  --socket=/run/mysqld/mysqld.sock --port=3306 --bind-address=0.0.0.0 \
  --skip-name-resolve --init-file=/init.sql --max-connections=500 \
  --innodb-buffer-pool-size=64M --innodb-log-file-size=16M "$@"
EOF2
    chmod 755 "$root/entrypoint.sh"
    tar -C "$root" -c . | docker import \
      -c 'ENTRYPOINT ["/entrypoint.sh"]' -c 'ENV PATH=/usr/sbin:/usr/bin:/bin' \
      -c 'EXPOSE 3306' - lease-test/mariadb:10.11 >/dev/null
    echo "build-test-images: built lease-test/mariadb:10.11 ($("$mariadbd" --version))"
  fi
fi

# Revision 2: the entrypoint starts an ensemble member (ZOO_MY_ID, ZOO_SERVERS).
zookeeper_revision=2
if wanted lease-test/zookeeper:3.8 "$zookeeper_revision"; then
  if [ ! -f /usr/share/java/zookeeper.jar ] || ! command -v java >/dev/null 2>&1; then
    echo "build-test-images: no ZooKeeper or no java (apt-get install zookeeper); lease-test/zookeeper:3.8 not built"
  else
    root=$work/zookeeper
    base "$root"
    # The JRE, without the JDK's parts (jmods, headers, javac's ct.sym, sources). Some of
    # its files are symlinks into /etc/java-17-openjdk and /etc/ssl: they are copied as
    # files; a symlink to nothing (src.zip without the sources package) is dropped.
    jhome=$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")
    mkdir -p "$root$jhome"
    cp -a "$jhome/." "$root$jhome/"
    rm -rf "$root$jhome/jmods" "$root$jhome/include" "$root$jhome/man" "$root$jhome/docs" \
      "$root$jhome/lib/src.zip" "$root$jhome/lib/ct.sym"
    find "$root$jhome" -type l | while read -r link; do
      if [ -e "${link#"$root"}" ]; then
        cp -aL --remove-destination "${link#"$root"}" "$link"
      else
        rm -f "$link"
      fi
    done
    copy_with_libs "$root" "$jhome/bin/java" /bin/sh
    for lib in "$root$jhome/lib/"*.so "$root$jhome/lib/server/"*.so; do
      copy_with_libs "$root" "${lib#"$root"}" >/dev/null 2>&1 || true
    done
    # zookeeper.jar names its dependencies in its manifest's Class-Path, as jars in
    # /usr/share/java (relative symlinks among them, kept as they are).
    mkdir -p "$root/usr/share" "$root/etc/zookeeper/conf"
    cp -a /usr/share/java "$root/usr/share/"
    cp -L /etc/zookeeper/conf/log4j.properties "$root/etc/zookeeper/conf/"
    mkdir -p "$root/zookeeper-data" "$root/var/log/zookeeper"
    # The entrypoint: a standalone server on port 2181 of every address, data in
    # /zookeeper-data (the harness mounts a tmpfs there), the log on the console. Debian's
    # zookeeper.jar names no SLF4J binding, so without slf4j-log4j12 and log4j 1.2 on the
    # class path the server logs nothing. Arguments go to the JVM (-Dname=value). Once the
    # server serves, the ContainerManager it starts last says "Using checkIntervalMs=100"
    # on stdout. With the official image's variables ZOO_MY_ID (this member's id) and
    # ZOO_SERVERS ("server.1=ADDR:2888:3888;2181 server.2=..."), a member of an ensemble
    # (initLimit and syncLimit from ZOO_INIT_LIMIT and ZOO_SYNC_LIMIT, default 50 and 10
    # ticks, as the harness's local ensemble).
    cat >"$root/entrypoint.sh" <<EOF2
#!/bin/sh
set -e
# The image has no cat: the shell's printf writes the configuration.
printf '%s\\n' tickTime=200 maxSessionTimeout=600000 dataDir=/zookeeper-data clientPort=2181 \\
  admin.enableServer=false extendedTypesEnabled=true 4lw.commands.whitelist=ruok,srvr,stat \\
  >/etc/zookeeper/conf/zoo.cfg
main=org.apache.zookeeper.server.ZooKeeperServerMain
if [ -n "\${ZOO_MY_ID:-}" ]; then
  printf '%s\\n' "\$ZOO_MY_ID" >/zookeeper-data/myid
  printf '%s\\n' "initLimit=\${ZOO_INIT_LIMIT:-50}" "syncLimit=\${ZOO_SYNC_LIMIT:-10}" \\
    \$ZOO_SERVERS >>/etc/zookeeper/conf/zoo.cfg
  main=org.apache.zookeeper.server.quorum.QuorumPeerMain
fi
exec $jhome/bin/java \\
  -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar \\
  -Xmx256m -Dznode.container.checkIntervalMs=100 -Dzookeeper.log.dir=/var/log/zookeeper \\
  -Dzookeeper.root.logger=INFO,CONSOLE "\$@" \\
  "\$main" /etc/zookeeper/conf/zoo.cfg
EOF2
    chmod 755 "$root/entrypoint.sh"
    tar -C "$root" -c . | docker import \
      -c 'ENTRYPOINT ["/entrypoint.sh"]' -c "ENV JAVA_HOME=$jhome" \
      -c "ENV PATH=$jhome/bin:/usr/bin:/bin" -c 'EXPOSE 2181' \
      -c "LABEL lease.test.revision=$zookeeper_revision" - lease-test/zookeeper:3.8 >/dev/null
    echo "build-test-images: built lease-test/zookeeper:3.8 (ZooKeeper $(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || echo '?'), $("$jhome/bin/java" -version 2>&1 | head -1))"
  fi
fi

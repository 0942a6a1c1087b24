#!/usr/bin/env bash
# Flink and Beam's Flink job server in .flink/ (git ignores it), for the tests that run the jobs on a
# real Flink session cluster on loopback (tests/test_flink.py) and for deploy/run_flink.sh:
#   .flink/flink-1.19.3/              Flink 1.19.3 (bin/, conf/, lib/, opt/): apache-flink and
#                                     apache-flink-libraries from the package index, downloaded by hash
#                                     (deploy/flink/requirements-flink.txt) and unpacked, never installed
#   .flink/job-server/beam-flink-job-server.jar
#                                     Beam's Flink runner (beam-runners-flink-1.19 2.62.0) and its
#                                     dependencies from Maven Central, shaded into one runnable jar
#                                     (deploy/flink/pom.xml): what run_flink.sh's JOB_SERVER_JAR takes
# Needs Java 17 and Maven (mvn) on PATH; without them it says so in one line and exits 1 (the
# bootstrap goes on; the Flink tests are skipped with that reason). Idempotent. Environment:
# PYTHON (a Python 3 with pip, default python3), FLINK_DIR (default .flink).
set -euo pipefail
cd "$(dirname "$0")/.."
FLINK_VERSION=1.19.3
DEST=${FLINK_DIR:-.flink}
PY=$(command -v "${PYTHON:-python3}") || { echo "install_flink.sh: no Python (${PYTHON:-python3})" >&2; exit 1; }
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"      # used from another folder below
for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "install_flink.sh: no $tool on PATH (Java 17 and Maven are needed): Flink not installed, its tests are skipped" >&2; exit 1; }
done
home="$DEST/flink-$FLINK_VERSION"
if [ ! -f "$home/lib/flink-dist-$FLINK_VERSION.jar" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # the wheel's scripts are the same on every platform: ask for one build, whatever this Python is
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --require-hashes --dest "$tmp" \
      --python-version 3.11 --platform manylinux2014_x86_64 --only-binary=apache-flink \
      -r deploy/flink/requirements-flink.txt
  rm -rf "$home.partial" && mkdir -p "$home.partial"
  (cd "$tmp" && "$PY" -m zipfile -e apache_flink-"$FLINK_VERSION"-*.whl wheel >/dev/null \
     && tar xzf apache-flink-libraries-"$FLINK_VERSION".tar.gz)
  cp -r "$tmp/wheel/pyflink/bin" "$tmp/wheel/pyflink/conf" "$home.partial/"
  libs="$tmp/apache-flink-libraries-$FLINK_VERSION/deps"
  cp -r "$libs/lib" "$libs/opt" "$libs/plugins" "$home.partial/"
  cp "$libs/bin/bash-java-utils.jar" "$home.partial/bin/"
  chmod +x "$home.partial"/bin/*.sh "$home.partial/bin/flink"
  rm -rf "$home" && mv "$home.partial" "$home"          # whole or not at all
fi
jar="$DEST/job-server/beam-flink-job-server.jar"
if [ ! -s "$jar" ]; then
  log=$(mktemp)
  if ! mvn -q -B -f deploy/flink/pom.xml package -DbuildDir="$PWD/$DEST/job-server" >"$log" 2>&1; then
    grep -E "ERROR|Could not" "$log" | head -5 >&2
    echo "install_flink.sh: Maven could not build Beam's Flink job server (above); Flink's tests are skipped" >&2
    rm -f "$log"; exit 1
  fi
  rm -f "$log"
  rm -rf "$DEST/job-server/target"
fi
echo "Flink $FLINK_VERSION in $home; Beam's Flink job server: $jar" >&2

#!/usr/bin/env bash
# Hadoop's MiniDFSCluster (hadoop-client-minicluster 3.4.1 and what it needs, JAXB for Java 17) from
# Maven Central in .hdfs/lib (git ignores it), for the tests that run the storage layer and the jobs
# on a real HDFS over WebHDFS (tests/hdfs_cluster.py). Users do not need it: the jobs reach HDFS
# from Python (webhdfs://). Needs Java 17 and Maven (mvn) on PATH; without them, or when Maven
# Central refuses, it says so in one line and exits 1 (the bootstrap goes on; the HDFS tests are
# skipped with that reason). Idempotent. Environment: HDFS_DIR (default .hdfs).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${HDFS_DIR:-.hdfs}
for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "install_hdfs.sh: no $tool on PATH (Java 17 and Maven are needed): the tests' HDFS not installed, its tests are skipped" >&2; exit 1; }
done
if [ ! -s "$DEST/lib/hadoop-client-minicluster-3.4.1.jar" ]; then
  log=$(mktemp)
  rm -rf "${DEST:?}/lib" "${DEST:?}/target"
  if ! mvn -q -B -f tests/hdfs/pom.xml package -DbuildDir="$PWD/$DEST" >"$log" 2>&1; then
    grep -E "ERROR|Could not" "$log" | head -5 >&2
    echo "install_hdfs.sh: Maven could not fetch Hadoop's MiniDFSCluster (above); the HDFS tests are skipped" >&2
    rm -rf "$log" "${DEST:?}/lib"; exit 1
  fi
  rm -rf "$log" "${DEST:?}/target"
fi
echo "Hadoop's MiniDFSCluster (3.4.1) in $DEST/lib" >&2

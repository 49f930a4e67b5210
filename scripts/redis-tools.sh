# Sourced by the device scripts: puts redis-server, redis-cli and redis-benchmark on a machine
# that reaches no package registry, from the Debian packages in .gl-redis/ (apt-get download
# redis-server redis-tools libjemalloc2 liblzf1 libatomic1 libssl3), unless they are there.
if ! command -v redis-benchmark >/dev/null && [ -d "$root/.gl-redis" ]; then
  for f in "$root"/.gl-redis/*.deb; do
    case $f in
    *libssl3*) ldconfig -p | grep -q 'libssl.so.3 ' && continue ;;
    *libatomic1*) ldconfig -p | grep -q 'libatomic.so.1 ' && continue ;;
    esac
    dpkg -x "$f" /
  done
  ldconfig
fi

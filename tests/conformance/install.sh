#!/usr/bin/env bash
# Install what the conformance tests run, into .tools/ (ignored by git), from the npm registry:
#   - Node.js >= 22 (the suite imports fs.globSync): the machine's `node` if it is new enough,
#     else the npm package `node`, pinned in tests/conformance/node22/package-lock.json;
#   - the suite and the TypeScript SDK client, pinned in tests/conformance/package-lock.json.
# Each part is installed with `npm ci` only when its lock file changed since the last install;
# downloads stay in .tools/npm-cache, so a repeated install is fast and offline-friendly.
# Prints the folder holding the `node` to use (put it first on PATH) as its last line.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/conformance"
tools="$root/.tools"
export npm_config_cache="$tools/npm-cache"
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false
export npm_config_loglevel=error

if ! command -v npm >/dev/null 2>&1; then
  echo "install.sh: npm is not installed (Debian: apt-get install npm)" >&2
  exit 1
fi

# Install $1 (a folder with package.json + package-lock.json) into $2 with `npm ci`, unless the
# same lock file is installed there already.
install_locked() {
  local source="$1" target="$2"
  if [ -d "$target/node_modules" ] && cmp -s "$source/package-lock.json" "$target/.installed-lock"; then
    return 0
  fi
  mkdir -p "$target"
  rm -rf "$target/node_modules" "$target/.installed-lock"
  cp "$source/package.json" "$source/package-lock.json" "$target/"
  (cd "$target" && npm ci >&2)
  # Written last: an interrupted install is redone next time.
  cp "$source/package-lock.json" "$target/.installed-lock"
}

node_major() {
  "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0
}

system_node="$(command -v node || true)"
if [ -n "$system_node" ] && [ "$(node_major "$system_node")" -ge 22 ]; then
  node_dir="$(dirname "$system_node")"
else
  install_locked "$here/node22" "$tools/node22"
  node_dir="$tools/node22/node_modules/node/bin"
  if [ "$(node_major "$node_dir/node")" -lt 22 ]; then
    echo "install.sh: $node_dir/node is not Node.js 22" >&2
    exit 1
  fi
fi

PATH="$node_dir:$PATH" install_locked "$here" "$tools/conformance"
echo "$node_dir"

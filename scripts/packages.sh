# Sourced by the set-up scripts: install_missing PKG... installs, with apt-get, the Debian
# packages that are not installed yet (apt-get update once per script, only when needed).
# FLOWKV_PACKAGES: the project's own build dependencies, shared by setup, sanitize and fuzz.
FLOWKV_PACKAGES=(cmake ninja-build g++ pkg-config libdnnl-dev libhwy-dev nlohmann-json3-dev
                 libcli11-dev libgtest-dev libspng-dev libturbojpeg0-dev libpcre2-dev
                 libutf8proc-dev libssl-dev libcpp-httplib-dev curl python3-venv)
_flowkv_apt_updated=0
install_missing() {
  local missing=() p sudo_cmd=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "$(basename "$0"): installing ${missing[*]}"
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  if ((!_flowkv_apt_updated)); then
    "${sudo_cmd[@]}" apt-get update -qq
    _flowkv_apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

#!/usr/bin/env bash
# Fetch Mesa >= 25 lavapipe (CPU Vulkan) from bookworm-backports into DEST without changing the system.
#
#   bash scripts/fetch_mesa.sh DEST
#
# apt runs with a private sources list, lists dir and cache under DEST/apt, so nothing under /etc or /var
# changes. The mirror comes from the machine's own apt configuration (the first `URIs:` line of
# /etc/apt/sources.list.d/debian.sources, or the first `deb` line of /etc/apt/sources.list). The packages
# are unpacked with `dpkg -x` into DEST/root and DEST/lvp_icd.json points the Vulkan loader at the
# unpacked lavapipe by absolute path; vlm_grpoma.envs.sapien.vulkan exports VK_ICD_FILENAMES from it.
# Idempotent (DEST/.ok marks a finished fetch). Where nothing can be fetched it prints a warning and exits 0:
# physics needs no Vulkan, and rendering tests skip naming DEST/FAILED's reason.
set -uo pipefail

DEST=${1:?usage: fetch_mesa.sh DEST}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
SUITE=bookworm-backports
PACKAGES=(mesa-vulkan-drivers libdrm2 libdrm-amdgpu1)
MIN_MESA_MAJOR=25

warn() {
    echo "fetch_mesa: WARNING: $1; SAPIEN rendering stays unavailable (physics is unaffected)" >&2
    echo "$1" > "$DEST/FAILED"
    exit 0
}

if [[ -f "$DEST/.ok" && -f "$DEST/lvp_icd.json" ]]; then
    echo "fetch_mesa: already fetched into $DEST"
    exit 0
fi
rm -f "$DEST/FAILED"

command -v apt-get >/dev/null && command -v dpkg >/dev/null || warn "apt-get/dpkg not found (not a Debian system)"

mirror=""
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
if [[ -z "$mirror" && -f /etc/apt/sources.list ]]; then
    mirror=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
fi
[[ -n "$mirror" ]] || warn "no Debian mirror found in the machine's apt configuration"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$keyring" ]] || warn "Debian archive keyring $keyring is missing"

APT="$DEST/apt"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/parts" "$APT/debs"
echo "deb [signed-by=$keyring] $mirror $SUITE main" > "$APT/sources.list"
APT_OPTS=(-o "Dir::Etc::SourceList=$APT/sources.list" -o "Dir::Etc::SourceParts=$APT/parts"
          -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o "Debug::NoLocking=1"
          -o "APT::Sandbox::User=root" -o "Acquire::http::Timeout=20" -o "Acquire::Retries=1")

echo "fetch_mesa: reading $SUITE package lists from $mirror"
apt-get "${APT_OPTS[@]}" -qq update >"$APT/update.log" 2>&1 \
    || warn "apt-get update of $SUITE failed (see $APT/update.log)"

# Resolve the version each package has in the suite now (the only suite in the private list).
specs=()
for pkg in "${PACKAGES[@]}"; do
    version=$(apt-cache "${APT_OPTS[@]}" madison "$pkg" 2>/dev/null | awk -v s="$SUITE" '$0 ~ s {print $3; exit}')
    [[ -n "$version" ]] || warn "$pkg is not available from $SUITE"
    specs+=("$pkg=$version")
done
mesa_version=${specs[0]#*=}
mesa_major=${mesa_version%%.*}
mesa_major=${mesa_major#*:}
(( mesa_major >= MIN_MESA_MAJOR )) || warn "$SUITE serves Mesa $mesa_version, older than $MIN_MESA_MAJOR"

echo "fetch_mesa: downloading ${specs[*]}"
(cd "$APT/debs" && rm -f ./*.deb && apt-get "${APT_OPTS[@]}" -qq download "${specs[@]}") >"$APT/download.log" 2>&1 \
    || warn "apt-get download failed (see $APT/download.log)"

rm -rf "$DEST/root"
for deb in "$APT/debs"/*.deb; do
    dpkg -x "$deb" "$DEST/root" || warn "dpkg -x $deb failed"
done

lib=$(find "$DEST/root" -name 'libvulkan_lvp.so' | head -n 1)
[[ -n "$lib" ]] || warn "libvulkan_lvp.so not found in the unpacked packages"
api=$(sed -n 's/.*"api_version": *"\([^"]*\)".*/\1/p' "$DEST"/root/usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | head -n 1)
cat > "$DEST/lvp_icd.json" <<EOF
{
    "ICD": {
        "api_version": "${api:-1.3.0}",
        "library_path": "$lib"
    },
    "file_format_version": "1.0.0"
}
EOF
echo "$mesa_version" > "$DEST/VERSION"
touch "$DEST/.ok"
echo "fetch_mesa: Mesa $mesa_version lavapipe ready; ICD $DEST/lvp_icd.json"

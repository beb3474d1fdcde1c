#!/bin/sh
# man.sh - writes the pipeshard(1) man page from the binary's own --help and --version texts, so
# it says what the binary does (CMake runs it at build time: build/pipeshard.1).
# usage: scripts/man.sh PATH/TO/pipeshard [OUT]   (OUT: default stdout; written whole or not at all)
set -eu
bin=$1
if [ $# -ge 2 ]; then
    "$0" "$bin" >"$2.tmp"
    mv "$2.tmp" "$2"
    exit 0
fi
# roff-escapes text read on stdin: backslashes, hyphens, and a leading '.' or "'"
esc() { sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }
version=$("$bin" --version | sed -n '1s/^pipeshard \([^ ]*\).*/\1/p')
commands=$("$bin" --help | sed -n 's/^  \([a-z][a-z]*\) .*/\1/p')
cat <<END
.TH PIPESHARD 1 "" "pipeshard $version" "User Commands"
.SH NAME
pipeshard \\- LLM inference split by layers across machines
.SH SYNOPSIS
.B pipeshard
.I COMMAND
[\\fIoptions\\fR]
.br
.B pipeshard \\-\\-version
.SH DESCRIPTION
Exit status 0 on success; otherwise non\\-zero and one line on stderr that says what is
wrong (2 for a usage error).
.PP
.nf
END
"$bin" --help | sed '1,2d' | esc
echo ".fi"
echo ".SH COMMANDS"
for c in $commands; do
    [ "$c" = version ] && continue
    echo ".SS pipeshard $c"
    echo ".nf"
    "$bin" "$c" --help | esc
    echo ".fi"
done
cat <<END
.SH VERSION
.nf
END
"$bin" --version | sed -n 1p | esc
cat <<END
.fi
.SH SEE ALSO
README.md and docs/ in the pipeshard sources.
END

# pipeshard-completion.bash - bash completion for pipeshard (installed by `cmake --install` to
# share/bash-completion/completions/pipeshard; or `source` this file). Commands come from
# `pipeshard --help`, a command's options from its --help (the usage lines and the lines that
# begin with an option), so they never fall behind the binary. Anything else completes file names.

# The options `pipeshard CMD --help` lists, one a line: every option of the usage lines (the
# first line and the deeper-indented lines right after it), and the options that begin a line
# of the option list (indented at most 4 spaces).
_pipeshard_options() {
    "$1" "$2" --help 2>/dev/null | awk '
        NR == 1 { syn = 1 }
        syn && (NR == 1 || /^      /) { print; next }
        { syn = 0; match($0, /^ */) }
        RLENGTH <= 4 && /^ *-/ {
            sub(/^ */, "")
            if (match($0, /^(-[A-Za-z], )?--?[A-Za-z][A-Za-z0-9-]*/)) print substr($0, 1, RLENGTH)
        }' |
        grep -oE '(^|[][ (|,])--?[A-Za-z][A-Za-z0-9-]*' | sed 's/^[][ (|,]//' | sort -u
}

_pipeshard() {
    local cur=${COMP_WORDS[COMP_CWORD]} bin=${COMP_WORDS[0]}
    if ((COMP_CWORD == 1)); then
        local cmds
        cmds=$("$bin" --help 2>/dev/null | sed -n 's/^  \([a-z][a-z]*\) .*/\1/p')
        COMPREPLY=($(compgen -W "$cmds --help --version" -- "$cur"))
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_pipeshard_options "$bin" "${COMP_WORDS[1]}")" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -o filenames -F _pipeshard pipeshard

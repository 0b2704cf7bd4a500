# Venvs kept between CI runs (sourced by .ci/run and .ci/vllm_lane.sh). A venv is reused while
# its key (what it was built from: pins, requirements, the Python) is unchanged and it holds
# exactly the packages it was built with; int8attn alone is installed afresh on every run.

# venv_frozen VENV: its packages, one `name==version` a line, sorted, int8attn left out
venv_frozen() { "$1/bin/pip" freeze --all | grep -v '^int8attn[ =@]' | sort; }

# venv_reusable VENV KEY: true when VENV was sealed under KEY and, its int8attn uninstalled,
# holds what it held then
venv_reusable() {
  [[ -f $1/.key && $(cat "$1/.key") == "$2" ]] && "$1/bin/pip" uninstall -q -y int8attn \
    && [[ $(venv_frozen "$1") == "$(cat "$1/.baseline")" ]]
}

# venv_seal VENV KEY: record what VENV holds now, under KEY
venv_seal() { venv_frozen "$1" > "$1/.baseline"; echo "$2" > "$1/.key"; }

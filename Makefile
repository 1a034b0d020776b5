# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
PORT ?= 8000

.PHONY: run test lint screenshot install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

var/secret_key:
	mkdir -p var
	$(PYTHON) -c "import secrets; print(secrets.token_urlsafe(50))" > $@
	chmod 600 $@

# The web process's memory settings, as the Procfile's (harness/processes.py, WEB_ENV, says why).
WEB_MEMORY = PYTHONMALLOC=malloc GLIBC_TUNABLES=glibc.malloc.mmap_threshold=262144:glibc.malloc.trim_threshold=131072

## Install, migrate and start the whole system on the embedded defaults.
run: $(STAMP) var/secret_key
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py migrate --no-input
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py collectstatic --no-input -v 0
	SECRET_KEY=$$(cat var/secret_key) $(WEB_MEMORY) $(BIN)/python manage.py serve --port $(PORT)

## Lint, check the import layers, then run the whole test suite (SQLite by default; DATABASE_URL=postgres://... for
## PostgreSQL, REDIS_URL=redis://... for the tests of real workers and the Redis layer).
test: $(STAMP)
	$(BIN)/ruff check runs awaken_site harness tests examples
	$(BIN)/lint-imports
	$(BIN)/pytest

clean:
	rm -rf $(VENV) var/static

## Lint with ruff, and check the layers and cycles of the imports (both configured in
## pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check runs awaken_site harness tests examples
	$(BIN)/lint-imports

## Redraw the README's pictures of the console (docs/<page>-<size>.png) with Debian's
## chromium (the command starts an embedded site of its own, in a temporary directory).
screenshot: $(STAMP) var/secret_key
	SECRET_KEY=$$(cat var/secret_key) $(BIN)/python manage.py screenshot

#!/usr/bin/env bash
# Placeholder until the SAPIEN rendering work lands: no renderer is fetched yet.
echo "fetch_mesa: rendering support arrives with issue #6; skipping"

#!/bin/sh
# Patroni's bootstrap.post_bootstrap: runs once, on the node that initialised the cluster, with the
# superuser's connection URL as $1. Creates the connector database.
set -eu
psql -X -v ON_ERROR_STOP=1 -q -d "$1" -c 'CREATE DATABASE connector'
echo "patroni-post-bootstrap: created database connector"

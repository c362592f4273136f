// Drain benchmark for graphile-worker (https://worker.graphile.org), driven by
// benchmarks/peers/graphile_worker.py, which installs the pinned package into a throwaway folder and
// runs this script with NODE_PATH pointing at it.
//
//   BENCH_CONFIG='<json>' node graphile_worker_bench.cjs
//   config: {connectionString, items, concurrency, queues, batched, localQueueSize,
//            completeJobBatchDelay, capMs}
//
// Steps: install graphile-worker's schema (runMigrations) into the given, empty database; insert
// `items` no-op jobs with graphile_worker.add_jobs (chunks of 10,000, one statement each); start one
// worker pool (concurrency jobs at a time, maxPoolSize concurrency + 1); count executions; when all
// have run, poll until graphile_worker's job table is empty (completion may be batched and written
// after the handler returns); stop the pool. A configuration still draining after capMs stops there
// and reports the rate over the jobs it executed (capped: true). Prints one JSON object on stdout.
// The rate is measured from the first job's start, so worker start-up is not counted.
"use strict";

const { performance } = require("node:perf_hooks");
const { Pool } = require("pg");
const { run, runMigrations, Logger } = require("graphile-worker");

const cfg = JSON.parse(process.env.BENCH_CONFIG); // env, not argv: the URL may hold a password
const silent = new Logger(() => () => {});
const CHUNK = 10000;

function workerOptions() {
  const worker = {};
  if (cfg.batched) {
    worker.localQueue = { size: cfg.localQueueSize };
    worker.completeJobBatchDelay = cfg.completeJobBatchDelay;
    worker.failJobBatchDelay = cfg.completeJobBatchDelay;
  }
  return {
    connectionString: cfg.connectionString,
    concurrency: cfg.concurrency,
    maxPoolSize: cfg.concurrency + 1,
    pollInterval: 1000,
    noHandleSignals: true,
    logger: silent,
    preset: { worker },
  };
}

async function remaining(pool) {
  const r = await pool.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs");
  return r.rows[0].n;
}

async function main() {
  const pool = new Pool({ connectionString: cfg.connectionString, max: 2 });
  try {
    await runMigrations({ connectionString: cfg.connectionString, logger: silent });

    const t0 = performance.now();
    for (let done = 0; done < cfg.items; done += CHUNK) {
      const n = Math.min(CHUNK, cfg.items - done);
      await pool.query(
        `SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
           SELECT ROW('noop', '{}'::json,
                      CASE WHEN $2::int > 0 THEN 'q' || floor(random() * $2::int)::int END,
                      NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
           FROM generate_series(1, $1::int)))`,
        [n, cfg.queues],
      );
    }
    const enqueueS = (performance.now() - t0) / 1000;
    const queued = await remaining(pool);
    if (queued !== cfg.items) throw new Error(`queued ${queued} jobs, expected ${cfg.items}`);

    let executed = 0;
    let firstStart = null;
    let allExecuted;
    const executedAll = new Promise((resolve) => (allExecuted = resolve));
    const taskList = {
      noop: async () => {
        if (firstStart === null) firstStart = performance.now();
        executed += 1;
        if (executed === cfg.items) allExecuted();
      },
    };

    const tStart = performance.now();
    const runner = await run({ ...workerOptions(), taskList });
    // Drain cap: a slow configuration stops after capMs and reports the rate over what it executed.
    let capTimer;
    const capped = new Promise((resolve) => {
      capTimer = setTimeout(() => resolve("capped"), cfg.capMs);
    });
    const outcome = await Promise.race([executedAll.then(() => "drained"), capped]);
    clearTimeout(capTimer);
    let tEnd;
    let done = executed;
    if (outcome === "drained") {
      while ((await remaining(pool)) > 0) await new Promise((r) => setTimeout(r, 5));
      tEnd = performance.now();
      done = cfg.items;
    } else {
      tEnd = performance.now();
      done = executed;
    }
    await runner.stop();

    if (firstStart === null) throw new Error(`no job ran within ${cfg.capMs} ms`);
    const drainS = (tEnd - firstStart) / 1000;
    process.stdout.write(
      JSON.stringify({
        items: cfg.items,
        executed: done,
        capped: outcome === "capped",
        jobs_per_s: done / drainS,
        drain_s: drainS,
        wall_incl_start_s: (tEnd - tStart) / 1000,
        enqueue_s: enqueueS,
        enqueue_per_s: cfg.items / enqueueS,
      }) + "\n",
    );
  } finally {
    await pool.end();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`graphile-worker bench failed: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);

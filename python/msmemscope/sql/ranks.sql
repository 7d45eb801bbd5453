-- msmemscope ranks: one line per dump (one rank's run on one device), for DuckDB and Spark alike
-- (only SQL both accept). The rules are those of the native engine, rank_summary.rs in
-- msmemscope_core; the runner (msmemscope/ranks_sql.py) provides two views:
--   dump(rank, run, device, dump, id, event, event_type, name, device_id, ptr, attr,
--        python_stack, size, allocation_id, owner, used, total)   every row of every dump's
--        Parquet file;
--        (run, device, dump) names a file
--   params(factor)   a line stands out above median * factor
WITH
numbered AS (
    -- seg: how many SYSTEM STEP rows the file has had so far (this row included)
    SELECT d.*,
           SUM(CASE WHEN event = 'SYSTEM' AND event_type = 'STEP' THEN 1 ELSE 0 END)
               OVER (PARTITION BY run, device, dump ORDER BY id
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS seg
    FROM dump d
),
step_rows AS (
    SELECT run, device, dump, seg, id, TRY_CAST(TRIM(name) AS BIGINT) AS step_no
    FROM numbered
    WHERE event = 'SYSTEM' AND event_type = 'STEP'
),
stepped AS (
    -- a STEP row's Name is the number of the step it starts; rows before the first: step 0
    SELECT n.*, COALESCE(s.step_no, 0) AS step
    FROM numbered n
    LEFT JOIN step_rows s
        ON s.run = n.run AND s.device = n.device AND s.dump = n.dump AND s.seg = n.seg
),
last_segs AS (
    -- the seg of each file's last step
    SELECT run, device, dump, MAX(seg) AS last_seg
    FROM step_rows
    GROUP BY run, device, dump
),
block_events AS (
    -- a block lives from its MALLOC to the next MALLOC or FREE of its (Device Id, pool, Ptr)
    SELECT run, device, dump, id, event, event_type AS pool, device_id, attr, python_stack,
           size, allocation_id, owner, used, step, seg,
           LEAD(id) OVER (PARTITION BY run, device, dump, device_id, event_type, ptr
                          ORDER BY id) AS next_id
    FROM stepped
    WHERE event IN ('MALLOC', 'FREE') AND event_type IN ('PTA', 'HAL', 'HOST') AND ptr <> 'N/A'
),
mallocs AS (
    SELECT * FROM block_events WHERE event = 'MALLOC'
),
candidates AS (
    -- the leaks analysis's candidates (the original msMemScope's rule): a block allocated in step
    -- >= 2 still live when the step after its own ends (at the STEP row that starts the one after
    -- that: at_id), or allocated in the step before the last and live at the end of the dump (at_id
    -- NULL: the end of the dump ends no step). Each with its allocation site as the analysis keys
    -- it: the Attr's site (else the first line of the Python stack), frame and op. Text up to an
    -- escaped quote stands for the whole value: both engines' regexp_extract read it so.
    SELECT m.run, m.device, m.dump, m.id, m.pool, m.device_id, COALESCE(m.size, 0) AS size,
           m.next_id, checked.id AS at_id,
           CASE WHEN m.attr LIKE '%"site":"%'
                THEN regexp_extract(m.attr, '"site":"([^"]*)"', 1)
                ELSE regexp_extract(m.python_stack, '^[^' || CHR(10) || ']*', 0) END AS site,
           regexp_extract(m.attr, '"frame":"([^"]*)"', 1) AS frame,
           regexp_extract(m.attr, '"op":"([^"]*)"', 1) AS op
    FROM mallocs m
    JOIN last_segs l ON l.run = m.run AND l.device = m.device AND l.dump = m.dump
    LEFT JOIN step_rows checked
        ON checked.run = m.run AND checked.device = m.device AND checked.dump = m.dump
       AND checked.seg = m.seg + 2
    WHERE m.step >= 2
      AND ((checked.id IS NOT NULL AND (m.next_id IS NULL OR m.next_id > checked.id))
           OR (checked.id IS NULL AND m.seg = l.last_seg - 1 AND m.next_id IS NULL))
),
site_ends AS (
    -- each site's live candidate bytes at each step end the program marked
    SELECT c.run, c.device, c.dump, c.pool, c.device_id, c.site, c.frame, c.op,
           e.id AS end_id, SUM(c.size) AS bytes
    FROM candidates c
    JOIN step_rows e
        ON e.run = c.run AND e.device = c.device AND e.dump = c.dump
       AND e.id >= c.at_id AND (c.next_id IS NULL OR c.next_id > e.id)
    GROUP BY c.run, c.device, c.dump, c.pool, c.device_id, c.site, c.frame, c.op, e.id
),
site_highs AS (
    SELECT s.*,
           MAX(bytes) OVER (PARTITION BY run, device, dump, pool, device_id, site, frame, op
                            ORDER BY end_id
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS high_before
    FROM site_ends s
),
leak_sites AS (
    -- a site leaks when its live candidate bytes reach a new high at two step ends or more
    SELECT run, device, dump, pool, device_id, site, frame, op
    FROM site_highs
    WHERE bytes > 0 AND (high_before IS NULL OR bytes > high_before)
    GROUP BY run, device, dump, pool, device_id, site, frame, op
    HAVING COUNT(*) >= 2
),
leaks AS (
    -- the candidates of leaking sites, every HAL candidate, and HAL blocks live at the end
    SELECT c.run, c.device, c.dump, c.id, c.size
    FROM candidates c
    JOIN leak_sites l
        ON l.run = c.run AND l.device = c.device AND l.dump = c.dump AND l.pool = c.pool
       AND l.device_id = c.device_id AND l.site = c.site AND l.frame = c.frame AND l.op = c.op
    UNION
    SELECT run, device, dump, id, size FROM candidates WHERE pool = 'HAL'
    UNION
    SELECT run, device, dump, id, COALESCE(size, 0) AS size
    FROM mallocs
    WHERE pool = 'HAL' AND next_id IS NULL
),
leak_totals AS (
    SELECT run, device, dump, SUM(size) AS leaked_bytes, COUNT(*) AS leaked_blocks
    FROM leaks
    GROUP BY run, device, dump
),
pta_mallocs AS (
    SELECT * FROM mallocs WHERE pool = 'PTA'
),
peaks AS (
    SELECT run, device, dump, MAX(used) AS peak_allocated
    FROM pta_mallocs
    WHERE used IS NOT NULL
    GROUP BY run, device, dump
),
peak_rows AS (
    -- the first row that reached the peak
    SELECT p.run, p.device, p.dump, p.peak_allocated, MIN(m.id) AS peak_id
    FROM peaks p
    JOIN pta_mallocs m
        ON m.run = p.run AND m.device = p.device AND m.dump = p.dump
       AND m.used = p.peak_allocated
    GROUP BY p.run, p.device, p.dump, p.peak_allocated
),
peak_steps AS (
    SELECT r.run, r.device, r.dump, r.peak_allocated, r.peak_id, m.step AS peak_step
    FROM peak_rows r
    JOIN pta_mallocs m
        ON m.run = r.run AND m.device = r.device AND m.dump = r.dump AND m.id = r.peak_id
),
reserved AS (
    -- CUDA devices only: the CPU allocator reserves nothing of its own
    SELECT run, device, dump, MAX(total) AS reserved_peak
    FROM stepped
    WHERE event IN ('MALLOC', 'FREE') AND event_type = 'PTA'
      AND device_id NOT IN ('cpu', 'N/A', '') AND total IS NOT NULL
    GROUP BY run, device, dump
),
live_at_peak AS (
    SELECT m.run, m.device, m.dump, m.id, COALESCE(m.size, 0) AS size, m.allocation_id,
           m.owner AS malloc_owner, p.peak_id
    FROM pta_mallocs m
    JOIN peak_rows p ON m.run = p.run AND m.device = p.device AND m.dump = p.dump
    WHERE m.id <= p.peak_id AND (m.next_id IS NULL OR m.next_id > p.peak_id)
),
relabels AS (
    -- the last SYSTEM OWNER row for a block's allocation id while it lived, up to the peak
    SELECT l.run, l.device, l.dump, l.id, o.owner,
           ROW_NUMBER() OVER (PARTITION BY l.run, l.device, l.dump, l.id
                              ORDER BY o.id DESC) AS pick
    FROM live_at_peak l
    JOIN stepped o
        ON o.run = l.run AND o.device = l.device AND o.dump = l.dump
       AND o.event = 'SYSTEM' AND o.event_type = 'OWNER'
       AND o.allocation_id = l.allocation_id AND o.owner IS NOT NULL
    WHERE o.id > l.id AND o.id <= l.peak_id
),
owned AS (
    SELECT l.run, l.device, l.dump, COALESCE(r.owner, l.malloc_owner) AS owner, l.size
    FROM live_at_peak l
    LEFT JOIN relabels r
        ON r.run = l.run AND r.device = l.device AND r.dump = l.dump AND r.id = l.id
       AND r.pick = 1
),
owner_bytes AS (
    SELECT run, device, dump, owner, SUM(size) AS bytes
    FROM owned
    WHERE owner IS NOT NULL
    GROUP BY run, device, dump, owner
),
top_owner AS (
    -- most bytes; equal bytes: the owner that sorts first
    SELECT run, device, dump, owner AS top_owner, bytes AS top_owner_bytes
    FROM (
        SELECT b.*, ROW_NUMBER() OVER (PARTITION BY run, device, dump
                                       ORDER BY bytes DESC, owner ASC) AS pick
        FROM owner_bytes b
        WHERE bytes > 0
    ) ranked
    WHERE pick = 1
),
files AS (
    SELECT rank, run, device, dump, COUNT(*) AS n_rows
    FROM dump
    GROUP BY rank, run, device, dump
),
summary AS (
    SELECT f.rank, f.run, f.device, f.dump, f.n_rows,
           ps.peak_allocated, ps.peak_step, rv.reserved_peak,
           COALESCE(lt.leaked_bytes, 0) AS leaked_bytes,
           COALESCE(lt.leaked_blocks, 0) AS leaked_blocks,
           t.top_owner, t.top_owner_bytes
    FROM files f
    LEFT JOIN peak_steps ps ON ps.run = f.run AND ps.device = f.device AND ps.dump = f.dump
    LEFT JOIN reserved rv ON rv.run = f.run AND rv.device = f.device AND rv.dump = f.dump
    LEFT JOIN leak_totals lt ON lt.run = f.run AND lt.device = f.device AND lt.dump = f.dump
    LEFT JOIN top_owner t ON t.run = f.run AND t.device = f.device AND t.dump = f.dump
),
peak_ranked AS (
    SELECT peak_allocated AS v, ROW_NUMBER() OVER (ORDER BY peak_allocated) AS pos,
           COUNT(*) OVER () AS n
    FROM summary
    WHERE peak_allocated IS NOT NULL
),
leak_ranked AS (
    SELECT leaked_bytes AS v, ROW_NUMBER() OVER (ORDER BY leaked_bytes) AS pos,
           COUNT(*) OVER () AS n
    FROM summary
),
medians AS (
    -- the mean of the middle value(s)
    SELECT
        (SELECT AVG(CAST(v AS DOUBLE)) FROM peak_ranked
          WHERE pos = CAST(FLOOR((n + 1) / 2.0) AS BIGINT)
             OR pos = CAST(FLOOR((n + 2) / 2.0) AS BIGINT)) AS peak_median,
        (SELECT AVG(CAST(v AS DOUBLE)) FROM leak_ranked
          WHERE pos = CAST(FLOOR((n + 1) / 2.0) AS BIGINT)
             OR pos = CAST(FLOOR((n + 2) / 2.0) AS BIGINT)) AS leak_median
)
SELECT s.rank, s.run, s.device, s.dump, s.n_rows, s.peak_allocated, s.peak_step,
       s.reserved_peak, s.leaked_bytes, s.leaked_blocks, s.top_owner, s.top_owner_bytes,
       CONCAT_WS(',',
           CASE WHEN s.peak_allocated IS NOT NULL AND m.peak_median IS NOT NULL
                 AND CAST(s.peak_allocated AS DOUBLE) > m.peak_median * p.factor
                THEN 'peak' END,
           CASE WHEN m.leak_median IS NOT NULL
                 AND CAST(s.leaked_bytes AS DOUBLE) > m.leak_median * p.factor
                THEN 'leaks' END) AS stands_out
FROM summary s
CROSS JOIN medians m
CROSS JOIN params p
ORDER BY s.rank ASC NULLS LAST, s.run, s.device, s.dump

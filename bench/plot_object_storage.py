#!/usr/bin/env python3
"""plot_object_storage.py - bench_object_storage.py's result as a bar chart (SVG, standard library only):
GB/s of every method per workload, the raw ceilings of the same direction as lines (dashed: through the S3 API,
the ratios' reference; dotted: through Swift's own API).

    python3 bench/plot_object_storage.py OUT.svg bench/results/RESULT.json
"""
import json
import sys

COLORS = {"ckptio": "#1f77b4", "runai": "#9467bd", "s3torch": "#ff7f0e", "fsspec": "#2ca02c", "boto3": "#8c564b"}
WORKS = ["load_model", "save_model", "load_dcp", "save_dcp"]


def main(out, path):
    doc = json.load(open(path))
    rows = [r for r in doc["results"] if "GBps" in r]
    ceil = doc["meta"].get("ceiling", {})
    top = max([r["GBps"] for r in rows] + [v["GBps"] for v in ceil.values() if isinstance(v, dict)]) * 1.15
    width, height, left, bottom, plot_h = 900, 420, 70, 60, 300
    group_w = (width - left - 20) / len(WORKS)
    y = lambda v: height - bottom - v / top * plot_h  # noqa: E731
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">Checkpoints in object storage '
           f'({doc["meta"].get("size", 0) / 2**20:.0f} MiB, {doc["meta"].get("server", "")}, '
           f'{doc["meta"].get("date", "")})</text>']
    for i in range(6):
        v = top * i / 5
        svg.append(f'<line x1="{left}" x2="{width - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    svg.append(f'<text x="16" y="{height / 2}" transform="rotate(-90 16 {height / 2})" text-anchor="middle">'
               'GB/s</text>')
    for g, work in enumerate(WORKS):
        x0 = left + g * group_w
        mine = [r for r in rows if r["work"] == work]
        bar = (group_w - 30) / max(len(mine), 1)
        for k, r in enumerate(mine):
            x = x0 + 15 + k * bar
            svg.append(f'<rect x="{x:.1f}" y="{y(r["GBps"]):.1f}" width="{bar - 4:.1f}" '
                       f'height="{height - bottom - y(r["GBps"]):.1f}" fill="{COLORS.get(r["method"], "#777")}"/>')
            svg.append(f'<text x="{x + (bar - 4) / 2:.1f}" y="{y(r["GBps"]) - 4:.1f}" text-anchor="middle" '
                       f'font-size="10">{r["GBps"]:.2f}</text>')
            svg.append(f'<text x="{x + (bar - 4) / 2:.1f}" y="{height - bottom + 14}" text-anchor="middle" '
                       f'font-size="10">{r["method"]}</text>')
        way = "get" if work.startswith("load") else "put"
        for api, dash in (("s3", "5,4"), ("swift", "1,3")):
            c = ceil.get(f"{api}-{way}")
            if isinstance(c, dict):
                svg.append(f'<line x1="{x0 + 8:.1f}" x2="{x0 + group_w - 8:.1f}" y1="{y(c["GBps"]):.1f}" '
                           f'y2="{y(c["GBps"]):.1f}" stroke="black" stroke-dasharray="{dash}"/>')
        svg.append(f'<text x="{x0 + group_w / 2:.1f}" y="{height - bottom + 34}" text-anchor="middle" '
                   f'font-weight="bold">{work}</text>')
    svg.append(f'<text x="{width - 20}" y="{height - 8}" text-anchor="end" font-size="10">raw ceiling, bare curl '
               'GETs / multipart PUTs of the same bytes: dashed via the S3 API (SigV4), dotted via the Swift API'
               '</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

/*
 * cli_table.c - plain-text tables whose columns fit their widest cell.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

void cli_table_init(cli_table *table, size_t ncols, const char *const *headers, const char *align) {
    memset(table, 0, sizeof *table);
    table->ncols = ncols;
    table->headers = headers;
    table->align = align;
}

int cli_table_add(cli_table *table, const char *const *cells) {
    if (table->nrows == table->cap) {
        size_t cap = table->cap ? table->cap * 2 : 16;
        char **grown = realloc(table->cells, cap * table->ncols * sizeof *grown);
        if (grown == NULL) return -1;
        table->cells = grown;
        table->cap = cap;
    }
    char **row = table->cells + table->nrows * table->ncols;
    for (size_t c = 0; c < table->ncols; c++) {
        /* Cells hold names from files: quoted once here for every table. */
        row[c] = strdup(cli_q(cells[c] ? cells[c] : ""));
        if (row[c] == NULL) {
            while (c-- > 0) free(row[c]);
            return -1;
        }
    }
    table->nrows++;
    return 0;
}

static void print_row(const cli_table *table, FILE *out, const char *indent, const char *const *cells,
                      const size_t *width) {
    /* Built in a buffer so that trailing blanks (empty last cells) can be
     * cut: lines end in text, which diffs and tests appreciate. */
    size_t len = strlen(indent) + 1;
    for (size_t c = 0; c < table->ncols; c++) len += width[c] + 2;
    char *line = malloc(len);
    if (line == NULL) return;
    size_t pos = (size_t)snprintf(line, len, "%s", indent);
    for (size_t c = 0; c < table->ncols; c++) {
        int w = (int)width[c];
        pos += (size_t)snprintf(line + pos, len - pos, table->align[c] == 'r' ? "%*s" : "%-*s", w, cells[c]);
        if (c + 1 < table->ncols) pos += (size_t)snprintf(line + pos, len - pos, "  ");
    }
    while (pos > 0 && line[pos - 1] == ' ') pos--;
    line[pos] = '\0';
    fputs(line, out);
    fputc('\n', out);
    free(line);
}

void cli_table_print(const cli_table *table, FILE *out, const char *indent) {
    size_t *width = calloc(table->ncols, sizeof *width);
    if (width == NULL) return;
    for (size_t c = 0; c < table->ncols; c++) width[c] = strlen(table->headers[c]);
    for (size_t r = 0; r < table->nrows; r++)
        for (size_t c = 0; c < table->ncols; c++) {
            size_t n = strlen(table->cells[r * table->ncols + c]);
            if (n > width[c]) width[c] = n;
        }
    print_row(table, out, indent, table->headers, width);
    for (size_t r = 0; r < table->nrows; r++)
        print_row(table, out, indent, (const char *const *)(table->cells + r * table->ncols), width);
    free(width);
}

void cli_table_cleanup(cli_table *table) {
    for (size_t i = 0; i < table->nrows * table->ncols; i++) free(table->cells[i]);
    free(table->cells);
    table->cells = NULL;
    table->nrows = table->cap = 0;
}

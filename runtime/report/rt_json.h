/*
 * rt_json: the one JSON (RFC 8259) writer of the reports (`ppl --json`, `needle --json`,
 * `info --json`, `ab --json`, the statistics fragments). It writes values to a stdio
 * stream; the caller writes the punctuation between them, so each report keeps its own
 * layout. Write errors are the stream's: the caller checks ferror/fclose once at the end.
 *
 * Numbers: JSON has no NaN or infinity, so a non-finite double is written as null.
 * rt_json_num uses %.9g (9 significant digits: every float round-trips, doubles are
 * rounded); rt_json_fixed a fixed number of decimals. Integers are written exactly; one
 * whose magnitude exceeds 2^53 (9007199254740992) is written as a decimal STRING
 * ("seed": "7743500180575576609"), because a JSON parser that reads numbers as IEEE
 * doubles (JavaScript, jq) would round it; at or below 2^53 it is a plain number.
 */
#ifndef RT_JSON_H
#define RT_JSON_H

#include <stdint.h>
#include <stdio.h>

/* A string literal: quotes, \" \\ \n escaped, other control bytes as \u00XX; bytes >= 0x80
 * are copied (the caller passes UTF-8). NULL writes null. */
void rt_json_str(FILE *out, const char *s);

/* A double with %.9g, or null when not finite. */
void rt_json_num(FILE *out, double v);

/* A double with `decimals` digits after the point (%.*f), or null when not finite. */
void rt_json_fixed(FILE *out, double v, int decimals);

/* An exact integer (a string above 2^53 in magnitude, see above). */
void rt_json_int(FILE *out, int64_t v);
void rt_json_uint(FILE *out, uint64_t v);

/* ,"key":v — a member after the first one of an object, v as rt_json_num. */
void rt_json_member_num(FILE *out, const char *key, double v);

/* ,"key":v with v as rt_json_fixed. */
void rt_json_member_fixed(FILE *out, const char *key, double v, int decimals);

#endif

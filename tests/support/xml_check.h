/*
 * xml_check: XML well-formedness for test suites that write SVG (see xml_check.c).
 */
#ifndef XML_CHECK_H
#define XML_CHECK_H

/* NULL when xml (NUL-terminated) is well-formed; else a message describing the first
 * problem (static or thread-unsafe buffer, valid until the next call). */
const char *xml_check(const char *xml);

#endif

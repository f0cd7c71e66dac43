/*
 * utf8.h - strict UTF-8 (RFC 3629): no overlong forms, no surrogates, no
 * code point above U+10FFFF.
 */
#ifndef DG_UTF8_H
#define DG_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence starting at s (at most n bytes
 * available), storing its code point in *cp; 0 if the bytes there are not
 * a complete valid sequence. */
size_t dg_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Encode cp (<= 0x10FFFF, not a surrogate) into out (4 bytes room);
 * returns the length, 0 for an invalid code point. */
size_t dg_utf8_encode(uint32_t cp, unsigned char *out);

/* Offset of the first byte where s[0..n) stops being valid UTF-8, or n if
 * it is valid throughout. */
size_t dg_utf8_valid_prefix(const unsigned char *s, size_t n);

/* Length of the longest prefix of s[0..n) that ends on a character
 * boundary, given that s[0..n) is valid UTF-8 except possibly for an
 * incomplete final sequence (the part a stream must hold back). */
size_t dg_utf8_complete_prefix(const unsigned char *s, size_t n);

/* Python's str.isspace() for one code point (what Jinja's trim strips). */
int dg_unicode_is_space(uint32_t cp);

#endif

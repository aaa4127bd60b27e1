// Package reverse reverses strings.
package reverse

// String returns s with its characters in reverse order.
func String(s string) string {
	b := []byte(s)
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return string(b)
}

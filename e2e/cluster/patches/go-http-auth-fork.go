// The two functions Traefik's containous/go-http-auth fork adds to upstream abbot/go-http-auth
// v0.4.0, which e2e/cluster/build.sh builds Traefik against (the Go module proxy does not serve
// the fork's version). Both are upstream's own code, moved: CheckSecret is the comparison in
// BasicAuth.CheckAuth (basic.go), RequireAuthStale is DigestAuth.RequireAuth (digest.go) with
// the challenge's stale flag set.

package auth

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// CheckSecret reports whether password matches secret, an htpasswd entry (bcrypt, {SHA} or
// MD5-crypt).
func CheckSecret(password, secret string) bool {
	compare := compareFuncs[0].compare
	for _, cmp := range compareFuncs[1:] {
		if strings.HasPrefix(secret, cmp.prefix) {
			compare = cmp.compare
			break
		}
	}
	return compare([]byte(secret), []byte(password)) == nil
}

// RequireAuthStale answers with a digest challenge whose nonce replaces a stale one
// (stale=true: the client retries with the new nonce without asking the user again).
func (a *DigestAuth) RequireAuthStale(w http.ResponseWriter, r *http.Request) {
	if len(a.clients) > a.ClientCacheSize+a.ClientCacheTolerance {
		a.Purge(a.ClientCacheTolerance * 2)
	}
	nonce := RandomKey()
	a.clients[nonce] = &digest_client{nc: 0, last_seen: time.Now().UnixNano()}
	w.Header().Set(contentType, a.Headers.V().UnauthContentType)
	w.Header().Set(a.Headers.V().Authenticate,
		fmt.Sprintf(`Digest realm="%s", nonce="%s", opaque="%s", algorithm="MD5", qop="auth", stale=true`,
			a.Realm, nonce, a.Opaque))
	w.WriteHeader(a.Headers.V().UnauthCode)
	w.Write([]byte(a.Headers.V().UnauthResponse))
}
